"""Code generation options: every tuning constant of the C backend, named in one place."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from opfuse.errors import OpfuseError

LAYOUTS = ("NCHW",)
WEIGHT_MODES = ("blob", "embed")
# "host": a shared library for this machine (its own thread pool, per-thread scratch outside the arena);
# "mcu": a standalone C99 library for a microcontroller (see ``codegen/mcu.py``).
PLATFORMS = ("host", "mcu")
SIMD_MODES = ("auto", "none")
# "host": the widest vector ISA of this machine's CPU (the host profile's vector width,
# ``opfuse.targets``), resolved when code is generated; "avx2" or "avx512": that ISA's register
# block and panels whatever the CPU (the C still runs anywhere: every intrinsics body sits
# behind ``#if`` on the compiler's target macros, with the narrower ones and plain C after it).
# "neon": aarch64 AdvSIMD (``#if defined(__aarch64__) && defined(__ARM_NEON)``; int8 with ``sdot`` where
# ``__ARM_FEATURE_DOTPROD``): an aarch64 host resolves "host" to it; on x86 it generates C to cross-compile
# (``runtime/aarch64.py``), whose x86 branches are then the plain C.
VECTOR_ISAS = ("host", "avx2", "avx512", "neon")
# The GEMM register block (MR, NR) of each ISA where ``gemm_mr`` / ``gemm_nr`` are 0 (measured:
# ``CodegenOptions.gemm_mr``).
# NEON: 6 x 16 is 24 q-register accumulators, 4 B vectors and 2 A registers (4 + 2 rows, multiplied in by
# lane): 30 of the 32. Paddle-Lite and the Arm Compute Library take 8 x 12 (24 accumulators, 3 + 2 loads per
# k step against 4 + 2 here); 6 x 16 keeps the AVX2 build's panels, so the NEON and the plain C builds pack
# the same blob, and every NR-multiple-of-8 assumption of the GEMM code holds. Not measured: there is no Arm
# host here (QEMU counts are not timings); to be measured on one against 8 x 12 and 4 x 16.
REGISTER_BLOCKS = {"avx2": (6, 16), "avx512": (8, 32), "neon": (6, 16)}
# The windows GEMM's largest MR with the AVX-512 block (``CodegenOptions.windows_mr_max`` None): where the
# host's FMA pipes are zmm-wide, and elsewhere.
WINDOWS_MR_MAX_FULL_WIDTH = 14
WINDOWS_MR_MAX = 8
WINOGRAD_MODES = ("auto", "off", "on")
PACK_WINDOWS_MODES = ("auto", "panel", "tile", "off")
REGISTER_ACTIVATION_MODES = ("auto", "all", "cheap")
PROFILE_CLOCKS = {"wall": "CLOCK_MONOTONIC", "thread_cpu": "CLOCK_THREAD_CPUTIME_ID"}


THREAD_GATES_ENV = "OPFUSE_THREAD_GATES"


@dataclass(frozen=True)
class CodegenOptions:
    # Activation layout. Only NCHW (ONNX's) for now; the emitter takes it as a parameter so
    # an NHWC path can be added without touching callers.
    layout: str = "NCHW"
    # "auto": the micro-kernels are AVX2/FMA intrinsics where the C compiler targets AVX2 and
    # FMA (``#if``), plain C99 elsewhere; "none": plain C99 only (the microcontroller build,
    # and the reference the intrinsics are tested against).
    simd: str = "auto"
    # Which intrinsics the micro-kernels are written for (``VECTOR_ISAS``): "avx512" adds an
    # AVX-512F body (``#if defined(__AVX512F__)``) to each micro-kernel whose block fits the 32
    # zmm registers, and makes ``REGISTER_BLOCKS["avx512"]`` the default block; the packed
    # weights follow the block, so the same model, options and ISA give the same C and blob.
    vector_isa: str = "host"
    # GEMM register block (MR x NR accumulators; 0: the ISA's, ``REGISTER_BLOCKS``). AVX2: 6 x 16
    # is 12 ymm accumulators, 2 B vectors and a broadcast (117 GFLOP/s per core on this host).
    # AVX-512: 8 x 32 is 16 zmm accumulators, 2 B vectors and a broadcast. Measured on this Zen 4
    # host (1 thread, CPU time). Micro-kernel alone (K = 128-512, 96-516 x 224, B's panel in L1):
    # 6x16 ymm 111-117 GFLOP/s, 6x32 / 8x32 / 12x32 / 14x32 zmm 109-118: all at the core's peak
    # (Zen 4 runs a zmm FMA as two 256-bit halves, so 512-bit code does not raise it). In the
    # model (mobilenet_v1, 30 interleaved runs, per-kernel CPU-time medians): 32-wide panels take
    # half the calls, panels and packing loops of 16-wide ones: pw7-pw11 (512 ch, 14x14) 0.86-0.90x
    # the time of 6 x 16 (89-93 -> 102-105 GFLOP/s), pw12/pw13 (7x7, with ``windows_mr_max``)
    # 0.83-0.84x, pw1-pw6 0.96-1.03x, whole model 0.915x (resnet18 0.89x, bert_layer 0.94x,
    # yolo_block 0.96x); 6x32, 8x32 and 12x32 within noise of each other (20 runs). 8 rows:
    # channel counts are multiples of 8 (12 would pad 64 to 72). On the Zen 5 host (two full-width zmm FMA
    # pipes; ``benchmarks/bench_microkernel.py``, 1 thread, CPU time, 15 interleaved rounds, load 2.4, M = 96,
    # N = 256, K = 128-1024): 8x32, 6x32, 12x32, 14x32, 6x64 and 8x48 all 234-242 GFLOP/s (the core's peak;
    # OpenBLAS's square sgemm 198-207 in the same run), 4x64 187-190, 16x16 (one broadcast per FMA) 174-177;
    # so 8 x 32 stays (the direct convolution's block changed: ``conv_direct_vectors``). Cache
    # blocks: K in blocks of at most KC; tiles of MC x NC outputs, at most ``gemm_tile_floats``
    # of C tile (it stays in L2); a side whose other operand is packed per tile spans up to
    # ``gemm_wide`` (one packing serves that many outputs); problems are cut into at least
    # ``gemm_min_tiles`` tiles where they can be, so threads have work to share.
    gemm_mr: int = 0
    gemm_nr: int = 0
    gemm_mc: int = 96
    gemm_nc: int = 256
    # K blocks of at most ``gemm_kc`` (512, was 256): every 1x1 layer of mobilenet_v1 up to 512 input
    # channels in one block, 1024 in two. Measured (1 thread, per-kernel thread CPU time, 30 interleaved
    # runs in rotating order, against two runs of 256 as controls): pw7-pw11 (512 -> 512, 14x14) 0.96-0.98x
    # (minimums 925-930 against 955-1000 us), pw12 0.93x, pw13 0.98x, fc 0.90x, others within the
    # controls' spread; whole model 0.975x (minimum sum 11.43 against 11.68 and 11.90 ms); resnet18,
    # bert_layer, yolo_block: minimum sums 0.99x, 0.99x, 0.96x. Results do not change (each sum runs
    # over k in the same order, a block's partial sums stored exactly). 1024 (was 512): K up to 1024 in one
    # block (mobilenet_v1's pw13, BERT's 768-deep MatMuls), resnet18's 3x3 layer4 (K = 4608) in 5 blocks
    # instead of 9. Measured (1 thread, per-kernel thread CPU time, interleaved, 2 cores shared, load 6-7;
    # against 512, two runs each in both orders): bert_layer's MatMuls 0.95-0.97x (sum of kernels 0.958x,
    # 0.973x); resnet18's layer4 convolutions 0.94-0.99x (sums 0.978x and 0.97x); mobilenet_v1 pw13 0.92x,
    # the rest within +-3% (sum 0.986x); yolo_block 1.00x. 1152 gained less (bert 0.976x, mobilenet
    # 1.01x).
    gemm_kc: int = 1024
    gemm_wide: int = 512
    gemm_tile_floats: int = 32768
    gemm_min_tiles: int = 4
    # Thread counts the tiles of a parallel GEMM, convolution or Winograd loop are balanced for, the
    # first first (``gemm.balance_tiles``): the run's thread count is known only at run time, so the
    # cuts aim at these; 2, the cores of this host (``gemm_min_tiles`` already gives most loops 4
    # tiles or more; balancing for 4 as well cut small problems into many tiny tiles). Empty: the
    # cache blocking as it is.
    balance_threads: tuple[int, ...] = (2,)
    # Balancing also tries the largest tiles, within the cache blocking's, that give every thread of a thread count
    # the same number of register panels (``gemm.balance_tiles``: mobilenet_v1's 14x14 pointwise layers, 14
    # panels of 14 positions, in 14 tiles of one panel, where the cuts near the blocking's 4 left 8 + 6 panels).
    balance_even_panels: bool = True
    gemm_prefetch: int = 32
    # The AVX2 micro-kernel's k loop unrolled this many times (``OPFUSE_PRAGMA(GCC unroll N)``; 0 or 1: as gcc
    # decides, which is not at all). Same sums in the same order, so the same bits. Measured on a Zen 3 VM
    # (2 vCPU, AVX2): the 6 x 16 loop alone over L1-resident panels 87-92 GFLOP/s unrolled by 4 against 75-78 rolled
    # (its 12 FMAs, 2 loads, 6 broadcasts and a prefetch per step left the loop's own increments and branch on the
    # critical issue slots); mobilenet_v1's 1x1 512 -> 512 at 14x14 in C, both builds alternating, 300 runs:
    # median 1394-1432 against 1549-1564 us. The AVX-512 body is left as it was (not measured: no such host here).
    gemm_k_unroll: int = 4
    # Where MR does not divide a GEMM's M, its last rows run in narrower panels of their own (``gemm.tail_panels``:
    # 128 rows in 20 x 6 + 4 + 4 instead of 22 x 6, the last panel two thirds zeros), each with the micro-kernel of
    # its width, instead of a padded panel whose result goes through the C tile and the tile epilogue. x86 vector
    # builds. Same sums in the same order, so the same bits. Measured on the Zen 3 VM (1 thread, CPU time): a 1x1
    # 128 -> 128 at 56x56 took 1828 us against 1665 for 126 output channels, 1695 with tails; mobilenet_v1 0.97x and
    # resnet18 0.98x of their time without (200 interleaved rounds), its stem 0.88x and pw13 0.90x (per kernel).
    gemm_tail_panels: bool = True
    # A convolution over its windows that stages its input rows per tile (padding or a prologue:
    # ``conv_windows.ConvWindows``) copies them once per thread and row block, not once per tile: the tiles
    # of one block of positions (cut along the channels) follow one another, and a thread that staged a block
    # skips the copy for the next tile of it. resnet18's layer4 on the Zen 5 host (1 thread, kernel CPU time, 40
    # interleaved runs, against off, load 10): the strided 3x3 (4 tiles of 128 channels, a 245 KB band each)
    # 0.98x, the 7x7 3x3 0.99x, layer2's strided 3x3 0.99x: small, but work that was repeated for nothing.
    gemm_reuse_band: bool = True
    # A GEMM that packs A per tile (the positions of a 1x1 convolution in NCHW at small spatial sizes, where A is the
    # activations and B the weights, cut in tiles of channels) in one K block skips the packing where the thread's
    # panels already hold the tile's row block (the tiles of one row block follow one another along the channels):
    # mobilenet_v1's pw12 and pw13 packed their 49 positions x 512 or 1024 channels once per tile of 256 channels.
    # Same bits.
    gemm_reuse_packed_a: bool = True
    # A GEMM whose constant B (a layer's weights, N output channels x K) has at least this many bytes, in one
    # column of tiles (every tile all N channels: A, the positions, packed per tile), splits N between the
    # threads when it runs on more than one (``gemm.weights_split``): ``balance_threads``' largest count of
    # parts, each thread's tiles in its own part (static schedule, N outermost), so each core streams its share
    # of the weights through its L2 instead of all of them once per tile; on one thread the tiles stay as
    # they were. 0: never. Measured on the Intel host (2 vCPU, 2 MB of L2 per core; mobilenet_v1, per-kernel
    # wall time, 25 interleaved rounds with an onnxruntime run between): its 14x14 pointwise layers (512 -> 512,
    # 1 MB of weights, 14 tiles of 14 positions) 403-407 -> 333-337 us on 2 threads (1.57-1.62x -> 1.88-1.92x
    # their 1-thread time), pw6 (256 -> 512, 512 KB) 223 -> 181 us, the whole model 5.15 -> 4.72 ms; 1 thread
    # unchanged (8.47 and 8.49 ms). Splitting N with dynamic tiles instead (``gemm_wide`` 256) took 380 us
    # and 0.93x the 1-thread speed. 512 KB, a quarter of that L2: resnet18's layer2.0.conv1 (295 KB of
    # weights, 4 tiles) was not faster split (386 -> 401 us, within its spread).
    gemm_split_weights_bytes: int = 1 << 19
    # A GEMM whose constant B (weights, packed in NR-column panels) has at least this many bytes, with B's panel
    # outermost (it stays in the caches while the tile's A panels pass), has each micro-kernel call prefetch its
    # share of the next panel's lines into L2, one line every few k steps (``gemm.next_panel``): the first call
    # on a panel then finds it in L2 instead of waiting on memory, where weights that are read once per run
    # are evicted between runs. x86 host builds. 0: never. Measured on the Intel host (2 vCPU, AVX-512, 2 MB of L2
    # per core; per-kernel wall time, 15-25 interleaved rounds with an onnxruntime run between): mobilenet_v1's pw13
    # (4 MB of weights) 846 -> 730 us, pw12 441 -> 377, pw7-pw11 (1 MB) 667-675 -> 645-656, the whole model 9.01 ->
    # 8.69 ms at 1 thread and 4.98 -> 4.88 at 2; bert_layer 14.07 -> 12.87 ms (its MatMuls 0.90-0.94x) and 7.23 ->
    # 6.79 at 2; resnet18's layer4.0.conv1 (4.5 MB) 1057 -> 851 us; yolo_block 1.38 -> 1.35 ms. Standalone (pw13 after
    # a 64 MB write, medians of 300 runs, 3-7 runs each): 893-970 -> 720-789 us, where all the weights in L3
    # took 707; a burst of the share's prefetches before each call instead took 899-949 (the misses stall the
    # core). 64 KB instead of 1 MB changed no layer of mobilenet_v1 (pw1-pw6 within 1-3%).
    gemm_next_panel_bytes: int = 1 << 20
    # A convolution read over its windows through the offset table (``conv_windows.ConvWindows``: the strided,
    # padded and 7x7 convolutions that do not run as Winograd or the direct kernel) gathers each block of MR
    # positions' K block once into a k-major panel, which the micro-kernel then reads in order for every panel of
    # channels, instead of broadcasting each value from its window through the table in every call (host builds).
    # "panel": one panel at a time, A's panels outermost (B's K block streamed from L2 per panel); "tile": the
    # whole tile's K block before the channel panels (B's panel in L1, A's from L2); "auto": "panel" while B's K
    # block is at most ``gemm.WINDOWS_PACK_PANEL_BYTES``, else "tile"; "off": the table read in place. Only where
    # a tile has ``gemm.WINDOWS_PACK_MIN_PANELS`` panels of channels, and not for 1x1 stride-1 windows (their
    # positions are consecutive floats already). Same values summed in the same order, so the same bits. Measured on
    # the Zen 3 VM (1 thread, kernel CPU time, interleaved against "off"): ``bench_kernels.py`` (20 rounds) the
    # strided 3x3 64 -> 128 at 56x56 0.93x, 256 -> 512 at 14x14 0.96x, the 1x1 stride-2 128 -> 256 0.93x, a grouped
    # 3x3 with 32 channels a group (2 panels) 1.04x slower and a 3x3 256 -> 256 at 5x5 in tiles of 64 channels (4
    # panels) 1.07x slower (hence the minimum of 8 panels); in resnet18 (30 rounds) its
    # strided 3x3 layers 0.86x, 0.88x, 0.94x and downsamples 0.86x, 0.88x, 0.81x, its kernels' sum 0.97x. "tile"
    # against "panel" on the 56x56 layer: 0.97x, within the run's noise. A hand-made build of that layer that
    # reads its panels without gathering them (wrong values) took 0.86x of the gathered one's time: what the
    # gather costs.
    gemm_pack_windows: str = "auto"
    # A GEMM with a single row (M = 1: a classifier's Gemm on one image) runs a 1 x ``gemm_gemv_nr``
    # micro-kernel (6 accumulators) with the intrinsics, instead of MR x NR whose MR - 1 rows
    # would repeat the one row's work: mobilenet_v1's fc (1x1024 @ 1024x1000) 161 -> 85 us (1 x 32:
    # 87, 1 x 16: 108; 1 thread, CPU time), 256 -> 1000 41 -> 23 us. A narrower row gets a narrower
    # panel (N rounded up to whole vectors). 0 keeps MR x NR; the plain C99 build (simd="none") does.
    gemm_gemv_nr: int = 48
    # A 1x1 convolution computed over its windows (positions x channels, ``conv_windows.py``: the
    # small spatial sizes whose positions leave NR-wide panels part empty, 7x7 and 10x10) with at
    # least this many output channels per group packs its positions per tile and K block into
    # k-major MR-row panels instead of broadcasting each value through the window offset table.
    # The packing is repeated per tile of channels, so it pays only where a tile has many: at 7x7
    # (1 thread, CPU time, against the windows) 1024 -> 1024 channels 0.86-0.90x, 512 -> 1024
    # 0.90x, 512 -> 512 0.96-0.97x, but 256 -> 256 1.09-1.14x and 128 -> 128 1.3x.
    windows_pack_min_channels: int = 512
    # The windows GEMM's MR with the AVX-512 block (``conv_windows.register_block``): the one in
    # [windows_mr_min, windows_mr_max] that pads the positions least (0: the options' MR).
    # mobilenet_v1 (20 interleaved runs, against MR = 8): pw12/pw13 (7x7: 7 rows of 7) 0.90x and
    # 0.89x; on the Zen 4 host a range up to 14 (14x14 in rows of 14) measured the same as up to 8.
    # None (the default): 14 where the host's FMA pipes are as wide as a zmm register
    # (``opfuse.targets.host_full_width_fma``, as ``winograd_avx512``), 8 elsewhere, resolved when the
    # code is generated. There a 14 x 32 block (28 zmm accumulators) loads 14 broadcasts and 2 B vectors
    # per 28 FMAs instead of 7 and 2 per 14 (the windows' reads, through the offset table, are what
    # holds these kernels below the packed micro-kernel's peak). Measured on the Zen 5 host (1 thread,
    # kernel CPU time, 40-50 interleaved rounds against 8, each after a 12 MB sgemm; load 9-10): resnet18's
    # strided 3x3 64 > 128 at 28x28 out 0.96-0.97x, the 1x1/2 downsample 0.92-1.00x, the 4-group 3x3
    # at 28x28 0.95-0.98x, 1x1 512 > 512 at 14x14 0.98-1.02x (7x7 outputs keep 7 rows of 7). Each output
    # sums its products in increasing k, one FMA each, whatever the block: the results keep their bits.
    windows_mr_min: int = 6
    windows_mr_max: int | None = None
    # Few channels per group (``conv_windows.NARROW_BLOCK``, 8 channels in one ymm vector): MR from 12 up to
    # ``narrow_mr_max`` (14: 14 ymm accumulators, a B vector and a broadcast fill the 16 ymm registers), the
    # one that pads the positions least, the larger on a tie (14x14: 196 positions in 14 rows of 14).
    # Measured (1 thread, kernel CPU time, 60 interleaved runs, 3x3 256 -> 256 at 14x14, 32 groups): 14
    # instead of 12 0.96x; with ``gemm_window_step`` 0.82x of 12 without it.
    narrow_mr_max: int = 14
    # A convolution over its windows whose MR-position blocks each lie in one output row (MR divides the
    # output width, or the windows are the input's own rows) reads the block's rows as one pointer and
    # constant displacements (``ConvWindows.row_step``, ``microkernel._window_rows``) instead of a
    # pointer per row: 14 row pointers did not fit the 16 general registers and were reloaded from the
    # stack for every broadcast. Measured as above: the 32-group layer 0.85x (14 x 8 block); resnet18
    # (16 interleaved runs, 7 x 32 blocks, whose 7 pointers fit): layer4 0.985-1.006x, the rest
    # 0.99-1.01x (no change). The Cortex-M7 build (4 x 4 blocks, QEMU, float32 zoo models, instructions,
    # outputs bitwise the same): resnet8 0.935x, mobilenet_v1_025_96 0.983x, ds_cnn 0.958x.
    gemm_window_step: bool = True
    # A 2-D convolution with constant weights and at most ``conv_direct_max_k`` input channels x taps
    # (a network's first layers) is computed channels x positions over a phase-split copy of its input
    # rows (``codegen/conv_direct.py``) instead of over its windows: NR = ``conv_direct_nr`` positions of
    # one output row per vector (the output width must be a multiple), MR = up to ``conv_direct_mr``
    # output channels with the AVX-512 body (the AVX2 block's rows otherwise), the C tile (channels x
    # positions) within ``conv_direct_tile_floats``. Where an output row is a single panel, K at most
    # ``conv_direct_one_panel_max_k``. 0 turns it off. Measured (1 thread, per-kernel thread CPU time,
    # 40 interleaved runs, medians against the windows, Conv+Relu): mobilenet_v1's stem (3 -> 32, 3x3 s2,
    # 112x112 out) 0.86x, and 0.76x with the micro-kernel's own epilogue; mobilenet_v1_025_96's (3 -> 8,
    # 48x48) 0.65x; resnet8's (3 -> 16, 32x32) 0.47x; resnet18's (3 -> 64, 7x7 s2, K = 147) 0.90x; 8 -> 32
    # 3x3 at 64x64 0.88x; 16 -> 32 3x3 s2 at 32x32 out 0.97x, but at 16x16 out (one panel a row) 1.07x
    # (K = 144), where 3 -> 16 and 8 -> 16 (K = 27, 72) are 0.68x and 0.69x. C tiles of 16384 floats
    # measured 0.96-0.98x of 8192, 4096 the same as 8192; MR = 16 against 8 and 12: 0.96x and 0.93x.
    conv_direct_max_k: int = 160
    conv_direct_one_panel_max_k: int = 96
    conv_direct_nr: int = 16
    conv_direct_mr: int = 16
    conv_direct_tile_floats: int = 16384
    # With the AVX-512 body the direct kernel's block is this many vectors of ``conv_direct_nr`` positions wide
    # (2: MR x 32, MR from 8 to 14, the least padding; ``conv_direct.direct_block``), so a broadcast weight feeds
    # two multiply-adds: MR x 16 takes a load per FMA, the load ports' limit once the FMA pipes are full-width
    # (Zen 5). An output width 16 divides but 32 does not (112) reads each panel as two pieces of 16, each in one
    # output row (``microkernel``'s ``b_split``). Measured on the Zen 5 host (1 thread, kernel timers in thread CPU
    # time, 20-30 interleaved runs, against 1; 2 cores shared, load 5-9): the micro-kernel alone (packed, K = 147)
    # 16 x 16 177 GFLOP/s, 8 x 32 215; resnet18's stem (64 channels, 8 x 32 in pieces) 0.85x the time (81 -> 95% of
    # the sgemm peak), in the model 0.84x; mobilenet_v1's stem (32 channels) 0.75x, mobilenet_v1_025_96's (8, 48
    # wide) 0.90x, resnet8's (16, 32 wide) 0.92x; the 32-group 3x3 layer at 14x14 (8 x 32 across rows) 0.89x.
    # 1: MR x 16, as measured above.
    conv_direct_vectors: int = 2
    # Grouped convolutions with at most ``conv_direct_max_k`` input channels per group x taps take the direct
    # kernel too, one GEMM per image and group (an output width NR does not divide: panels across output
    # rows, ``conv_direct.ShiftedBand``), instead of the windows GEMM's 14 x 8 blocks of positions x channels,
    # whose one-vector-wide panels broadcast an input value per multiply-add (load-bound). Measured on the 3x3
    # 256 -> 256 layer at 14x14 in 32 groups (1 thread, kernel CPU time, 40-60 interleaved runs, three rounds,
    # load 12-17): 0.84-0.91x the time after the benchmark's sgemm, 0.72-0.78x warm; alone in C (min of 2000)
    # 81-86 against 91-93 us; with the AVX2 block (``vector_isa="avx2"``, 4 x 16) 89 against 91 us. The 4-group
    # layer (K = 288) stays on the windows. Not the Cortex-M7's (no direct kernel there).
    conv_direct_grouped: bool = True
    # A GEMM whose output is the anchor's, or its Relu's, with a row bias at most, stored along its
    # unit-stride rows in whole register blocks, is finished and stored by the micro-kernel after its
    # last K block (``gemm.register_epilogue``) instead of through the C tile and the epilogue loop.
    gemm_register_epilogue: bool = True
    # ... also where the epilogue starts with the Add of a constant bias along N (a MatMul's bias, ``bias[n]``),
    # then at most one activation: the micro-kernel adds the block's column bias vectors (x86, along the rows;
    # ``microkernel.EPILOGUES`` "c"). bert_layer's QKV projection and its FFN's MatMul + bias + Gelu were
    # finished through the C tile (128 x 224-256 floats, from L2) after the last micro-kernel call.
    gemm_column_bias_epilogue: bool = True
    # ... also where the epilogue adds a residual after the bias (an Add of a float32 tensor of the output's shape,
    # stored in memory laid out as the output, which may be its own buffer: the Add done in place), then at most one
    # activation: the micro-kernel loads the residual's vectors and adds them in registers (x86, along the rows;
    # ``microkernel`` epilogue code "a"). ppocr_cls's 1x1 Conv 88 -> 16 + Add groups went through the C tile, a
    # copy-packed B and the vector epilogue and measured 1.24-1.30x their Conv and Add unfused.
    gemm_residual_epilogue: bool = True
    # The float32 constants a product reads (the weights and biases of Conv, ConvTranspose, Gemm, MatMul, after
    # BatchNorm folding) are generated with their subnormal values (0 < |w| < 2^-126) as zeros of the same sign
    # (``weights.flush_subnormals``; counted in the build report's ``subnormal_weights_flushed``). x86 multiplies a
    # subnormal operand in microcode (a floating-point assist, ~100 cycles an instruction outside the DAZ mode),
    # and trained weights hold some (weight decay drives unused ones toward 0): ppocr_rec's squeeze-excitation 1x1
    # convolutions (480 -> 120 and 240 -> 64 on one position, 0.1 MFLOP) took 1030 and 260 us, with them flushed
    # 22 and 11 (the model 12.5 -> 11.3 ms, 1 thread). A product of one with a finite float is below 2^-126 times
    # that float: onnxruntime's outputs on ppocr_rec are the same bits with them flushed. Off: stored as they are.
    flush_subnormal_weights: bool = True
    # Which activations the storing micro-kernel may apply after its bias (``microkernel.ACTIVATIONS``): "all", or
    # "cheap" (Relu and the erf Gelu's table only: the exp-based Sigmoid, SiLU, Tanh and tanh Gelu go through the C
    # tile and the vector epilogue), or "auto": "all" with AVX-512's 32 registers, "cheap" with AVX2's 16, where the
    # 12 accumulators leave 4 for an exp's temporaries. Measured on the AVX2 host (Zen 3, 1 thread, kernel timers,
    # interleaved rounds, against "all"; the same bits): yolo_block's 1x1 Conv + SiLU groups cv1 (32 -> 32 at 80x80)
    # 0.91x and cv2 (64 -> 32) 0.92x (40 rounds); Conv 1x1 64 -> 32 at 80x80 + SiLU 0.95x, Sigmoid 0.98x, Tanh 0.98x,
    # tanh Gelu 0.97x, erf Gelu 1.01x (kept in registers; bert_layer's FFN the same either way), 40 rounds.
    gemm_register_activations: str = "auto"
    # A fused epilogue (a convolution's or a MatMul's elementwise ops through the GEMM's C tile, or along the rows
    # of Winograd's output transform) whose ops all have a vector form (``simdchain.VECTOR_OPS``) and whose loop is
    # unit stride in every output runs ``simd_unroll`` vectors at a time in AVX-512 / AVX2 intrinsics, the scalar
    # loop under ``#else`` (``epilogue.VectorEpilogue``); and the storing micro-kernel applies a Sigmoid, SiLU, Tanh
    # or Gelu after the bias in registers (``microkernel.ACTIVATIONS``). Same bits. Needs ``simd_elementwise`` too.
    # (gcc does vectorise the scalar loop of a Conv + Sigmoid tile, one 16-lane chain of ~40 instructions an
    # iteration, latency-bound.) Measured (Conv 1x1 32 -> 64 at 200x152 + act, ``bench_epilogues.py``, 1 thread,
    # CPU time, cold caches, load ~13, against the same build with this off): fused/unfused Sigmoid 1.15-1.21 ->
    # 0.90-0.92, SiLU 1.19-1.22 -> 0.93-0.94, HardSwish 1.08-1.16 -> 0.81-0.83, Tanh 1.13-1.16 -> 0.99,
    # Gelu(tanh) 1.13-1.20 -> 1.02-1.04. False: the scalar loops everywhere.
    vector_epilogue: bool = True
    # A depthwise convolution's epilogue over its dense plane or its rows (``codegen/depthwise.py``) in the same
    # vector form where it has an exp- or log-based op (``depthwise.DENSE_VECTOR_OPS``), a plane's last elements the
    # vector that ends at its end where the epilogue loads nothing else along it; the others (Relu, Clip, affine
    # ops) stay gcc's vectorised scalar loop. Same bits (Gelu: within its rounding). Measured (depthwise 3x3 + act,
    # 1 thread, thread CPU time, 31 interleaved rounds, caches flushed, fused/unfused with this on and off):
    # 64 x 200 x 152: Softplus 0.91 (1.69 off), Sigmoid 0.76 (0.95), SiLU 0.75 (0.98), Tanh 0.80 (0.98), Gelu 0.79
    # (1.29); 256 x 14 x 14: 1.00-1.08 (1.27-1.93); 512 x 7 x 7 plane by plane: 1.13-1.23 (1.21-1.87), a 49-float
    # plane's few vectors latency-bound where the standalone kernel streams (below). False: the scalar loop.
    depthwise_vector_epilogue: bool = True
    # ... and where a plane has fewer floats than this (and the epilogue reads nothing along the planes but their
    # results), once over the chunk's planes (``depthwise_chunk_planes``) after them, not plane by plane (same
    # bits). Measured as above (41 rounds): 7 x 7 planes (96, 512 and 1024 channels) fused/unfused 0.98-1.04, plane
    # by plane 1.03-1.21; 14 x 14 unchanged (0.98-1.03 either way): at parity, the tensors in L2 either way.
    depthwise_batch_epilogue_below: int = 256
    # Such a vector epilogue of a GEMM with one K block (K <= KC) and its output along n runs on each MR-row strip
    # of the C tile right after the micro-kernel computed it (A's panels the outer loop), while the strip is in
    # L1, instead of over the whole tile (64 x 256 floats: from L2) after the last micro-kernel call; only where
    # B's K block is at most ``gemm.ROWS_OUTER_STORE_BYTES`` (64 KiB; it is re-read for each A panel).
    gemm_strip_epilogue: bool = True
    # ... and prefetches the output lines of each block the micro-kernel computed, so that the strip's stores
    # find them in L1 instead of waiting for memory (write-allocate) with no arithmetic left to hide it.
    gemm_strip_prefetch: bool = True
    # The same for a GEMM whose output runs along its rows (a convolution over its windows, positions x
    # channels): the micro-kernel adds its columns' bias, applies the Relu, transposes 8 x 8 runs in
    # registers and stores them along the positions (``microkernel._store_transposed``), instead of the
    # C tile's copy, its transposition and the epilogue loop (``gemm_register_epilogue`` must be on too).
    # Measured (1 thread, per-kernel thread CPU time, interleaved, against off; 2 cores shared, load 8):
    # within the noise. mobilenet_v1 (40 runs) pw6-pw12 0.97-1.02x, pw13 1.01x, kernels' sum 0.986x;
    # resnet18 (12 runs) layer4's 7x7 convolutions 0.99-1.02x; single layers (80 runs, twice) 512 -> 512 at
    # 14x14 0.98x, 1024 -> 1024 at 7x7 1.01-1.05x, 3x3 256 -> 256 g32 at 14x14 1.00x. The columns of
    # fewer than 8 rows are stored by 4, 2 and 1 lanes: with masked stores (AVX-512VL) the g32 layer
    # took 1.12-1.15x and the 7x7 one 1.03-1.05x.
    gemm_transposed_store: bool = True
    # With the micro-kernel storing along n (above) and B packed per tile, A's panels outermost (B's packed K
    # block, at most ``gemm.ROWS_OUTER_STORE_BYTES``, streamed from L2) where the output is past a core's L2
    # (``gemm.ROWS_OUTER_STORE_MIN_OUTPUT``), so each MR-row block of output is written as MR runs of the
    # tile's columns (``gemm.emit_gemm``): a 1x1 convolution of few input channels (64 -> 128 at 112x112)
    # 0.90-0.96x the time with cold caches, mobilenet_v1's pw1 0.87x.
    gemm_rows_outer_store: bool = True
    # A GEMM whose B is packed per tile from rows in memory (a 1x1 convolution's input) in one K block: after
    # each micro-kernel call, prefetch a share of the B rows of the tile the thread takes next
    # (``gemm._next_pack``), so that its packing copy reads them from the caches: a tile's rows are K runs
    # (64-512) too many for the hardware prefetchers to follow. Measured on the Zen 5 host (kernel CPU time,
    # 40 interleaved rounds after a 12 MB sgemm, two builds each way, load 12): 1x1 64 > 128 at 112x112
    # 0.86-0.95x, 128@56 0.95-1.0x, 256@28 0.99-1.03x; in mobilenet_v1 (inputs warm from the layer before,
    # kernels' sum, 60 rounds) 0.99-1.00x: pw1 0.96-0.97x, but pw2/pw3 1.03-1.05x.
    gemm_pack_prefetch: bool = True
    # ... with this locality (``__builtin_prefetch``'s third argument; 3: into L1, 2: into L2; the Zen 5 host
    # measured them alike: 64 > 128 at 112x112 0.92-0.95x and 0.91-0.92x, mobilenet_v1 1.00x both).
    gemm_pack_prefetch_locality: int = 2
    # A tile's B panels packed by its first row block's micro-kernel calls, which read B's rows in place and store
    # them to the packed panel as they go, instead of a copy before the calls (``gemm.pack_in_kernel``: a 1x1
    # convolution's input on the x86 host builds, B's panel the outer loop). Measured on the Intel host (1 thread):
    # 1x1 128 -> 128 at 56x56 alone (a C harness, medians of 300 warm runs) 699-719 -> 659 us; in mobilenet_v1
    # (per-kernel wall time, 25 interleaved rounds, two runs) pw2-pw5 0.95-0.98x, in yolo_block its 1x1 layers
    # 0.95-0.97x. With A's panels outermost (pw1's rows-outer store) it took 1.36x: not done there.
    gemm_pack_in_kernel: bool = True
    # Plain-C micro-kernel with named scalar accumulators (``codegen/microkernel.py``): for a
    # compiler without vector registers (the Cortex-M7), which keeps an accumulator array in memory.
    gemm_scalar_accumulators: bool = False
    # Keys tiles of the attention kernel's online softmax.
    attention_block: int = 64
    # Attention over at most this many keys runs them as one block (``attention.py``): the softmax in one pass
    # (max; exp and sum), the second product setting Ot where the online form clears it, rescales it by
    # exp(m - m') after each block and adds. Scratch: the whole score panel (bert_layer's 128 keys x 64 queries, 32
    # KiB). 0: always the online form.
    attention_one_pass_max_keys: int = 256
    # The one-pass softmax of a whole St panel (NR real queries) in explicit AVX-512 / AVX2 vectors (max, then the
    # vector exp_nonpos stored over St and summed per lane, t ascending: the C loops' bits), where gcc vectorised
    # the C loops with ymm and masks. Off: the C loops alone.
    attention_vector_softmax: bool = True
    # Where every query block is whole, the tile's queries are packed panel by panel as K is (``attention.py``);
    # off: query by query, as before (the same values).
    attention_panelled_queries: bool = True
    # Attention (``codegen/attention.py``): where the batch (heads) alone makes at least this many tiles,
    # a tile takes every query block of its head and packs K and V once for them; with fewer heads a
    # tile per query block keeps the threads busy, each packing K and V again. bert_layer (12 heads, 2
    # blocks of 64 queries), the kernel alone at 1 thread: packing K and V took ~110 of ~775 us.
    attention_min_tiles: int = 8
    # The attention kernel and its parallel loops' functions are compiled with GCC's
    # ``target("prefer-vector-width=512")`` where the vector ISA is AVX-512 (``kernel.VECTOR_512``): the loops gcc
    # vectorises itself there (the softmax's bookkeeping, the packing of Q, K and V, the output through the
    # epilogue) run in zmm, the rest of the program at 256 bits (``runtime.toolchain.AVX512_VECTOR_WIDTH_FLAGS``).
    # The same bits: gcc reorders no floating-point sum without -ffast-math. None: on where the host's FMA pipes
    # are zmm wide (``opfuse.targets.host_full_width_fma``), as ``depthwise_avx512``. Measured on bert_layer
    # (Intel family 6 model 167 guest, 1 thread, kernel timers): inferences back to back (5 a round, 20 rounds;
    # the C harness, 200) 586 -> 533 us (550-559 -> 498-516); one inference between other work (``opfuse bench``,
    # ``bench_scaling.py --vs``, where the kernel takes 600-700 us) 674 -> 680, within noise; 2 threads: no change.
    attention_vector_width_512: bool | None = None
    # Integer conv (``codegen/qconv.py``) with a fused epilogue: its dot products over at least this
    # many int16 pairs are called out of line (their SMLAD loop then does not spill beside the
    # epilogue's live values); shorter ones stay inline, where the call would cost more. Measured on
    # the emulated M7 (instructions, fused int8 zoo models): 8 or 16 slows mobilenet's 1x1 convs of
    # 16-64 channels, 33 (K > 64: resnet8's 3x3x16 convs out of line) is the best of 8/16/32/33/65.
    int8_dot_call_min_pairs: int = 33
    # Host int8 depthwise convolution (``codegen/qgemm.py``, AVX2): output rows narrower than this many
    # positions are computed 8 channels per vector (channels innermost in a padded copy built by 8x8 byte
    # transposes), wider ones 8 positions of a row per vector (a narrow row leaves lanes of its last vector
    # idle). Measured (kernel timers, 1 thread, int8 mobilenet_v1_025_96 and ds_cnn, channels vs positions):
    # 2.6 vs 17.0 us at 3x3, 5.3 vs 7.7 us at 6x6, 7.7 vs 13.6 us at 25x5 (64 channels), 7.3 vs 17.3 us at
    # 12x12 stride 2, but 10.5 vs 9.7 us at 12x12 stride 1; the whole mobilenet's kernels 260 us with 16,
    # 276 with 8, 316 with positions everywhere.
    int8_depthwise_channels_below: int = 16
    # The same threshold for a strided depthwise convolution (the positions kernel builds a plane of every input
    # row and column phase, 4 words per output at stride 2): measured (1 thread, CPU time, interleaved, int8
    # mobilenet_v1's stride-2 layers, channels / positions): dw2 (56 wide) 0.80, dw4 (28 wide) 0.71, dw6 (14 wide,
    # channels already) 1.01.
    int8_depthwise_strided_channels_below: int = 64
    # Host int8 kernels (``codegen/qgemm.py``): requantize in double (``acc * mult 2^-shift`` converted with round
    # half to even: 5 vector operations per 8 outputs) where the generator proves it exact for every input
    # (``qgemm.exact_in_double``: the channel's accumulator bound times its multiplier below 2^53; short sums:
    # 1x1 convs of few channels, depthwise, first layers), the 64-bit integer sequence (11) elsewhere. Both are
    # bit-exact. Measured (1 thread, CPU time medians of 40 interleaved runs, single int8 convs of mobilenet_v1's
    # shapes, the 64-bit path's time over the double's; 2 cores shared, load ~13): conv1 1.09, pw1 1.10, pw3 1.04,
    # dw1 1.05, dw3 1.03, dw5 1.05 (pw7-pw13 take the 64-bit path: their sums are long).
    int8_requantize_double: bool = True
    # Host int8 MatMul built for AVX-512 (``codegen/qmatmul_host.py``, u8 x s8 quads): the micro-kernel on zmm
    # (16 columns a vector, ``vpdpbusd`` zmm where the compiler has AVX512-VNNI) rather than ymm. Measured (1 thread,
    # CPU time medians of 40 interleaved runs, int8 bert_layer whole model, Zen 4, load ~15): zmm / ymm 0.96, 0.96.
    int8_matmul_zmm: bool = True
    # The same for the host int8 convolution's u8 x s8 GEMM (``codegen/qgemm.py``, 16 output positions per zmm)
    # where a row of the GEMM (a 1x1 stride-1 conv's whole plane) has at least this many positions (0: never).
    # Narrow rows waste lanes: int8 resnet8 (rows of 8-32) took 2.06x the time with zmm everywhere.
    int8_conv_zmm_min_row: int = 48
    # Integer conv (``codegen/qconv.py``, two or more output channels per group): output positions per pass
    # over the weights. 2: two int16 columns, each weight and column word loaded once for two SMLADs
    # (``opfuse_dot22_s16``); 1: one column, two channels (``opfuse_dot2_s16``). The Cortex-M7 takes 2
    # (``CORTEX_M7``; emulated, instructions: mobilenet_v1_025_96 22.74M -> 20.43M, resnet8 29.57M ->
    # 25.57M, ds_cnn 7.49M -> 6.56M); the host keeps 1, where gcc's vectorised plain C of the 2x2 form
    # is slower (1 thread, CPU time medians: mobilenet_v1_025_96 1.10x, ds_cnn 1.05x the time of 1).
    # With 2 the threshold above was re-measured (8/16/33/65/never: totals within 0.5%, 33 kept).
    int8_conv_positions_per_pass: int = 1
    # With two positions per pass: output channels per pass, 2 (``opfuse_dot22_s16``) or 4 (``opfuse_dot42_s16``,
    # the four channels' weights interleaved by tap pair: two column words and four consecutive weight words
    # per eight SMLADs). The Cortex-M7 takes 4, and calls the dot product out of line from 65 pairs
    # (``CORTEX_M7``; emulated, instructions, mobilenet_v1_025_96 / resnet8 / ds_cnn: 2 channels 20.43M /
    # 25.57M / 6.56M; 4 channels with the threshold at 17: 18.69M / 21.21M / 5.95M, 33: 18.64M / 21.21M /
    # 5.92M, 65: 18.62M / 21.21M / 5.92M, never: 18.57M / 24.46M / 5.92M).
    int8_conv_channels_per_pass: int = 2
    # Integer depthwise conv (``codegen/qdepthwise.py``): outputs of one row computed per pass, so that
    # each of the channel's taps (in registers or spilled) is read once for all of them. Measured on the
    # emulated M7 (instructions per MAC, int8 mobilenet_v1_025_96's 13 depthwise layers): 1: 7.00, 2: 6.27,
    # 3: 6.19, 4: 6.51 (more accumulators spill); 2 for the smaller code at about the same count.
    int8_depthwise_outputs_per_pass: int = 2
    # Recurrent layers (``codegen/recurrent.py``) project the input one block of this many time
    # steps at a time: the block's gate pre-activations (steps x batch x gates x hidden floats)
    # stay in cache until the time loop reads them, and a long sequence needs no T-sized scratch.
    recurrent_block_steps: int = 32
    # Below this many elementary operations a loop runs on one thread (spawning costs more). Measured
    # here (2-core VM, libgomp, GOMP_SPINCOUNT=10000, 2 threads): a parallel region costs 0.6-0.7 us
    # when the workers are still spinning (within ~0.1-0.3 ms of their last region), 20-40 us when they
    # have gone to sleep (the first kernel of an inference that follows other work), 0.3 us for a
    # barrier inside one region. A GEMM's 2^15 FLOP are about 0.3-0.6 us of one core, so for GEMMs
    # the bound is low by ~4x, for elementwise loops (tens of us per 2^15 elements) it is right. The
    # program's own pool (threadpool.py, since 2026-12-03) costs 0.15-0.27 us per near-empty loop where
    # libgomp took 0.69-0.99 us on the same 2-vCPU host (workers awake); the bound was not re-tuned.
    parallel_min_work: int = 1 << 15
    # A kernel with a product (Conv, MatMul, Gemm, attention: the ops whose loops count FLOPs) splits its loops
    # across threads only where it is worth the split as a whole: at least ``parallel_min_flops`` FLOPs (the
    # registry's count over its ops) or ``parallel_min_bytes`` of operands and results (its boundary tensors,
    # weights included: a 1 x 1024 x 1000 Gemm is 2 MFLOP but reads 4 MB). Below both it runs on one thread
    # whatever the thread count (``ProgramBuilder.kernel``; ``KernelInfo.one_thread`` says why). What it saves:
    # a parallel loop costs a wake-up or a hand-over, and its neighbours then read what the other core wrote (on the
    # 2-vCPU Intel host, ds_cnn's AveragePool took 0.62 us after a one-thread Conv, 2.2 us after a two-thread
    # one: its 32 KB input moved between the cores). Measured there (per kernel, wall clock, an onnxruntime
    # run between inferences as in ``opfuse bench``, 1 thread -> 2): ds_cnn's 1x1 convs (1 MFLOP, 80 KB)
    # 7.2 -> 8.5-9.4 us and its depthwise (144 KFLOP) 2.1 -> 2.3-3.6; mobilenet_v1_025_96's 1x1 convs of 0.6
    # MFLOP 4.8-6.5 -> 6.3-10.6 us, of 1.2 MFLOP and 100 KB 9.1-9.7 -> 8.2-8.4, of 1.2 MFLOP and 280 KB 9.5 ->
    # 6.5; resnet8's 1x1 shortcuts (0.26 MFLOP) 2.4-5.0 -> 4.5-7.0, its 3x3 convs of 2.4 MFLOP 16 -> 11.7-15.2;
    # mobilenet_v1's depthwise of 0.45-0.9 MFLOP and 0.5-1 MB 17.4-24.1 -> 11.9-25.7 us, its fc (2 MFLOP,
    # 4 MB of weights) 264 -> 142 us. Whole models at 2 threads (interleaved medians of 300, an onnxruntime run
    # between), this gate against none: ds_cnn 0.083 -> 0.056 ms (1 thread 0.058), mobilenet_v1_025_96 0.219 ->
    # 0.197 (0.167: the rest is the wake, ``pool_wake_min_flops``), resnet8 0.190 -> 0.201 (0.168).
    parallel_min_flops: int = 1 << 21
    parallel_min_bytes: int = 1 << 18
    # Workers that have gone to sleep (``threadpool.SPIN_NS`` after their last loop) are woken for an inference
    # only where its kernels with split loops come to at least ``pool_wake_min_flops`` FLOPs or
    # ``pool_wake_min_bytes`` bytes of operands and results (``_size`` of each, summed); otherwise that
    # inference runs on one thread (``opfuse_pool_begin``), and on all where the workers are still awake. Where
    # they are worth waking, ``opfuse_run`` wakes them first, so that they are up by the first split loop. On
    # the 2-vCPU Intel host (a KVM guest) waking a core that has been idle for a millisecond costs the caller
    # 10-26 us in the wake call and the worker is running 30-70 us later (``pthread_cond_broadcast``, medians
    # and 10th-90th percentiles of 300), so that resnet8 (24 MFLOP split, 0.16 ms on one thread) took 0.20 ms
    # on 2 threads with an onnxruntime run between inferences (workers asleep) and 0.135 ms with workers kept
    # spinning; every model above 64 MFLOP gains from its second thread (``make bench``). With both gates (as
    # above): ds_cnn 0.051 ms (1 thread 0.052), mobilenet_v1_025_96 0.166 (0.164), resnet8 0.168 (0.167).
    pool_wake_min_flops: int = 1 << 26
    pool_wake_min_bytes: int = 1 << 23
    # False: neither of the two rules above; every loop at least ``parallel_min_work`` splits and every inference
    # wakes the workers (what threads did before them). The test suite and ``opfuse fuzz`` run so, to exercise
    # the threaded code on the small graphs they build; the environment's ``OPFUSE_THREAD_GATES=0`` sets the
    # default (``THREAD_GATES_ENV``).
    thread_gates: bool = field(default_factory=lambda: os.environ.get(THREAD_GATES_ENV, "1").strip() != "0")
    # Depthwise convolution (``codegen/depthwise.py``) walks its channel planes in chunks of up to
    # ``depthwise_chunk_planes`` (the padded plane's zero border is written once per chunk, not
    # per plane), fewer planes per chunk where there would otherwise be fewer than
    # ``depthwise_min_chunks`` chunks for the threads to share.
    depthwise_chunk_planes: int = 8
    depthwise_min_chunks: int = 16
    # The in-place depthwise rows path (AVX2; rows of at least 16 floats) finishes the bias and a Relu
    # or Clip epilogue on the result vectors and stores them to the output, instead of storing the
    # results, then reading them back through a scalar epilogue loop per row
    # (``depthwise.register_epilogue``). In mobilenet_v1 (1 thread, wall clock, interleaved, with
    # ``depthwise_block_group``): dw1 0.62x, dw3 0.83x, dw5 0.62x, dw2 0.78x, dw4 0.75x the time.
    depthwise_register_epilogue: bool = True
    # The in-place rows path computes ``depthwise_row_block`` output rows together (an input row
    # they share is loaded once: 3x3 stride 1, 12 loads for 18 FMAs instead of 18) and the vectors
    # of a row ``depthwise_block_group`` at a time, input row by input row, so that their chains
    # of FMAs (each 4 cycles a step) interleave. Measured on this Zen 4 host (1 thread, warm, CPU time,
    # interleaved, load 8-9 on 2 cores): groups of 1 / 2 / 4 vectors with 2 rows, mobilenet_v1's
    # dw1 32@112: 1.00 / 0.93 / 0.90, dw2 64@112/2: 1.00 / 0.90 / 0.91, dw3 128@56: 1.00 / 0.88 /
    # 0.87, dw4 128@56/2: 1.00 / 0.93 / 0.87, dw5 256@28: 1.00 / 0.98 / 0.96; 2 rows x 2 vectors and
    # 4 rows x 2 vectors within 3% of 2 x 4; 3 or 4 rows of 1 vector -0.05 to +0.07 against 2.
    # 2 x 4 is 8 accumulators and 9 weights: 17 vector registers, one spilled where only 16 exist.
    depthwise_row_block: int = 2
    depthwise_block_group: int = 4
    # The in-place depthwise paths (rows and whole plane) get an AVX-512F body, 16 floats a zmm, before
    # their AVX2 one (``#if defined(__AVX512F__)``) where ``vector_isa`` is "avx512"; the same bits (each
    # element's taps in the same order). None (the default): on where the host's FMA pipes are zmm wide
    # (``opfuse.targets.host_full_width_fma``), resolved when the code is generated, as ``winograd_avx512``.
    depthwise_avx512: bool | None = None
    # ``depthwise_row_block`` and ``depthwise_block_group`` of the AVX-512 rows body (32 zmm registers). A
    # group of 8 is a whole row (rows of at most 8 zmm take this path), whose 16-float blocks each input row
    # then loads once (``depthwise_zmm_shifted_taps``). Measured on the Zen 5 host (1 thread, kernel CPU time,
    # interleaved, medians of 25-30, load 12), rows x group against 2 x 4: dw 32@112 (7 zmm a row) 2 x 8 cold
    # 0.85x, warm 0.87x (in mobilenet_v1 0.61x); 3 x 4, 3 x 2, 4 x 2 and 1 x 7 0.93-1.42x; the 56- and 28-float
    # rows (4 and 2 zmm) within noise of each other with any of them.
    depthwise_zmm_row_block: int = 2
    depthwise_zmm_block_group: int = 8
    # The AVX-512 rows body at stride 1 loads each input row's 16-float blocks once and shifts the taps'
    # vectors out of two neighbours (``valignd``), instead of one (two-ymm) load per tap.
    depthwise_zmm_shifted_taps: bool = True
    # The AVX-512 rows body finishes a Relu/Clip epilogue in registers (``depthwise_register_epilogue``) on
    # rows shorter than 16 floats too, storing a part vector by halves, and a HardSwish (the scalar C's
    # multiply, add, max, min and multiply: the same bits). In mobilenet_v1 (1 thread,
    # kernel CPU time, 30 interleaved runs against False, load 12): dw6 (14 a row) 0.80x, dw12 (7) 0.93x.
    depthwise_zmm_register_epilogue: bool = True
    # Where the whole-plane path applies (stride 1, "same", at most 256 floats), the AVX-512 body is the zmm plane:
    # each 16-float block of the plane loaded once and every tap's vector moved out of the two blocks it straddles
    # (``valignd``, the padding's lanes zeroed by its mask: ``depthwise._direct_plane_shifted``; False: a masked load,
    # two ymm halves, per tap and vector), the same bits; measured against the masked-load plane (Zen 5 host, 64
    # channels, 3x3 + bias + Relu, 1 thread, thread CPU time, 300 interleaved rounds, load 1.2-1.3): 0.75-0.88x from
    # 10x10 up and on planes of short rows, 0.95-1.05x on 3x3 to 8x8.
    depthwise_zmm_plane_shifted: bool = True
    # ... and it finishes a Relu, Clip or HardSwish epilogue on its vectors and stores them to the output (no pass
    # over the dense plane in L1), as ``depthwise_zmm_register_epilogue`` does for the rows. So it runs faster than
    # the rows path on every plane measured (as above, load 5-6): 0.89-0.99x from 3x3 to 16x16 and 10x25; in the
    # models (interleaved builds, kernel timers, load 2.7-5.4) ds_cnn's four 25x5 layers 0.83x of the plane with the
    # dense pass (4.1 us on the rows, 2.05 now), mobilenet_v1's 14x14 layers 0.93-0.95x and its dw13 (7x7) 0.79x of
    # the rows, mobilenet_v1_025_96's 6x6 and 3x3 layers 0.74-0.78x.
    depthwise_zmm_plane_register_epilogue: bool = True
    # Where the zmm plane cannot finish the epilogue (a residual Add; or the two options above off), the rows path
    # (with the register epilogue of the rows) runs the whole plane instead, as it did for every plane before:
    # mobilenet_v1's 512@14 layers (1 thread, kernel CPU time, interleaved, load 12) in the model 0.53-0.59x
    # (dw7-dw11), alone 0.75x warm and 0.92x cold (against the masked-load zmm plane; 0.68x and 0.85x against AVX2's).
    depthwise_zmm_plane_rows: bool = True
    # ... except where the rows would waste lanes on a plane of short rows: the plane runs where it has at least
    # ``depthwise_zmm_plane_min_vectors`` zmm and the rows path would take ``depthwise_zmm_plane_rows_max_ratio``
    # times as many or more (OH x ceil(OW / 16) against ceil(OH x OW / 16)). Measured (as above, the shifted plane
    # with the dense pass): plane / rows 0.46 (64x4), 0.63-0.65 (40x6, 49x5, 20x4), 0.78 (25x5), 0.83 (32x8),
    # 0.91-0.98 (8x8, 16x12, 12x12, 10x10, 7x7, 12x20) where the ratio is 1.33-4; 0.99-1.09 at 1.0-1.25 (16x16,
    # 10x25, 14x14); 1.10-1.15 on one-vector planes (3x3, 4x4), 0.98-1.00 on 5x5, 6x6.
    depthwise_zmm_plane_rows_max_ratio: float = 1.3
    depthwise_zmm_plane_min_vectors: int = 4
    # The in-place depthwise rows path (AVX2 and AVX-512 bodies) of a layer whose row stride is at least
    # ``depthwise_prefetch_min_stride`` prefetches its input into L2 this many bytes past the last input row each
    # step reads (the rows the step advances by, one ``prefetcht1`` a line, on into the next plane, none past the
    # tensor); 0: none, the default: it won only right after a 128 MiB copy, never with the input just written by
    # the layer before, as in a model. Measured (Zen 5 host, 1 thread, kernel CPU time, builds interleaved in random
    # order, load 6-8), 8 KiB against none: right after a 128 MiB copy (``bench_kernels.py``'s cold case)
    # mobilenet_v1's stride-2 layers 64@112, 128@56, 256@28, 512@14 took 0.90-0.93x, 0.87-0.96x, 0.85-0.94x,
    # 0.90-1.03x the time (3 x 60 rounds; 4 KiB 0.93-0.98x, 16 KiB 0.89-1.05x); in mobilenet_v1, the input just
    # written by the pointwise layer before, 1.13-1.21x (dw2, dw4, dw6; dw12 1.03x; ``bench_depthwise.py``, 60
    # rounds), after a 1x1 conv at batch 1, 4 and 16 (a 3, 12 and 49 MiB input) 1.27x, 1.09x and 1.12x. Stride 1
    # runs as fast as a plain loop over its own bytes already (``bench_kernels.py``'s ``loop``): there 2-8 KiB took
    # 0.93-1.13x cold.
    depthwise_prefetch_bytes: int = 0
    depthwise_prefetch_min_stride: int = 2
    # A 2-D pool read in place (AVX2, ``pool._in_place``) prefetches its input into L2 this many bytes
    # past the first row each output row reads, the rows one step advances by, on into the next plane
    # (never past the tensor); 0: none. The hardware prefetcher left resnet18's fused Relu+MaxPool
    # waiting on memory: it reads conv1's 3.2 MB output, written through the Conv's 1.3 ms and, on a
    # busy machine, pushed out of the shared L3 by the other core's processes. Measured (1 thread,
    # kernel timers in thread CPU time, the same build with 0 and with the distance, interleaved, 100
    # rounds, load 37-44): fused Relu+MaxPool 4 KiB 183 -> 164 us, 8 KiB 187 -> 131, 16 KiB 182 -> 129;
    # the unfused MaxPool, whose input the Relu pass before it leaves in the caches, 94-99 -> 106-109 at
    # every distance (prefetching lines already there costs that; every other line only: the same cost,
    # no gain fused; into L1 instead of L2: fused -27, unfused +22). yolo_block, resnet8, ds_cnn: no
    # kernel moved by more than 5 us.
    pool_prefetch_bytes: int = 8192
    # When the outermost loop has fewer iterations than this, the parallel loop collapses two loops.
    parallel_min_outer: int = 16
    # A parallel loop whose every iteration is at least this much work (GEMM, conv and attention
    # tiles) hands iterations out one at a time, schedule(dynamic, 1): tiles differ in size (the
    # remainder tiles) and a thread may be descheduled on a shared machine, and static halves then
    # leave one thread idle. Lighter iterations (elements, rows, planes) keep static chunks: no
    # atomic per iteration. Threads never change results: every iteration is independent.
    parallel_dynamic_min_work: int = 1 << 15
    # ... except a GEMM's tiles along one side (``gemm``: consecutive tiles write consecutive runs of the
    # output) whose static blocks are balanced (``kernel.STATIC_MIN_EFFICIENCY``): those stay static, so
    # each thread writes one contiguous part of every output plane and the next kernel reads long runs
    # from each core's cache, not runs of a tile's width from alternate cores.
    parallel_static_contiguous: bool = True
    # Winograd convolution (``codegen/winograd.py``) for 3x3, stride-1, dilation-1, ungrouped
    # float32 convolutions with constant weights. "auto": where profitable by the rule below
    # (and never in the plain C99 build, simd="none", whose results stay those of the direct
    # kernel); "on": every legal convolution; "off": none. The transform: F(4x4, 3x3)
    # (``winograd_f4``) where both output sides are at least ``winograd_f4_min_spatial``,
    # F(2x2, 3x3) below. Profitability ("auto"): input and output channels both at least
    # ``winograd_min_channels`` (``winograd_f2_min_channels`` for F(2x2)) and both output
    # sides at least ``winograd_min_spatial``. Measured (1 thread, thread CPU time, against
    # the direct kernel, Conv+Add+Relu): F(4x4) 2.35x at 64 ch 56x56, 2.3x at 128 ch 28x28, 1.8x
    # at 256 ch 14x14, 1.5x at 32 ch 16x16, 1.6x at 16 ch 32x32 and 80x80, but 0.86x at 64 ch 8x8
    # (4 tiles in 8 lanes); F(2x2) 1.6x at 64 ch 8x8, 1.2x at 48 ch 10x10, 1.06x at 32 ch 8x8,
    # 0.85-0.93x at 16 ch 8x8 and 10x10; at 7x7 (512 ch) F(2x2) 1.00x, F(4x4) 0.43x.
    # F(4x4)'s error (points 0, 1, -1, 2, -1/2: 1.1e-5 to 1.8e-5 max abs on resnet18's layers
    # with O(1) outputs, direct 4e-6 to 7e-6, F(2x2) 2e-6 to 3e-6) stays within the tests'
    # tolerance (rtol 1e-4 + atol 1e-5); ``winograd_f4=False`` gives F(2x2) everywhere. A block
    # of tiles keeps its transformed input and output (alpha^2 (Cin + Cout) floats per tile)
    # within ``winograd_block_floats``.
    winograd: str = "auto"
    winograd_min_channels: int = 16
    winograd_f2_min_channels: int = 32
    winograd_min_spatial: int = 8
    # Below ``winograd_min_spatial``, F(2x2) still where both output sides are at least
    # ``winograd_small_spatial`` and the channels in and out at least ``winograd_small_min_channels``:
    # there the GEMM, not the transforms or the padded tiles, carries the time. Measured on the Zen 5
    # host (Conv 3x3 + Relu, C -> C channels, 1 thread, kernel CPU time, 40 interleaved runs, F(2x2) on
    # AVX-512 panels against the direct kernel): at 7x7 512 ch 0.60x (resnet18's layer4), 1024 ch 0.58x,
    # 256 ch 0.71x, 160 ch 0.80x, 128 ch 0.82-0.83x, 96 ch 0.91x, but 64 ch 1.03x and 32 ch 1.22x; at 6x6
    # 512 ch 0.76x, 256 ch 0.89x, 128 ch 1.00x; at 5x5 512 ch 1.20x, at 4x4 1.60x. (The Zen 4 host with
    # AVX2 panels measured 7x7 512 ch at 1.00x.)
    winograd_small_spatial: int = 6
    winograd_small_min_channels: int = 128
    winograd_f4: bool = True
    winograd_f4_min_spatial: int = 12
    winograd_block_floats: int = 1 << 18
    # Winograd's batched GEMMs on the AVX-512 block (where it pads the tiles no further than the
    # AVX2 block; ``winograd._register_block``) instead of AVX2's 6 x 16. None (the default): on where the
    # host's FMA pipes are as wide as a zmm register (``opfuse.targets.host_full_width_fma``: AMD Zen 5 and
    # Intel Sapphire Rapids on), resolved when the code is generated (``resolved``), off elsewhere. On the
    # Zen 4 host it did not pay (zmm FMAs in two halves; resnet18, 1 thread, per-kernel CPU time, medians of 16
    # interleaved runs, against 6 x 16): layer1's F(4x4) convolutions (64 ch, 56x56) 0.94-1.09x, layer2's
    # (128 ch, 28x28) 0.91-1.04x, whole model 1.00x. On the Zen 5 host, where 6 x 16 ymm runs at half the zmm peak
    # (``bench_kernels.py``, kernel CPU time, 30 interleaved runs against off, load 10): r18.l1 (64 ch, 56x56)
    # 0.79x, r18.l2 (128 ch, 28x28) 0.85x, r18.l3 (14x14: 16 tiles, AVX2's block either way) 1.02x; in resnet18
    # (kernels' sum, 1 thread, 20 interleaved runs against off, load 11-12) 0.92x, resnet8 0.90x (stack1's
    # 16-channel 32x32 convolutions 0.73x), yolo_block 0.93x (its 3x3 convolutions 0.84-0.90x).
    winograd_avx512: bool | None = None
    # Channels ahead whose input rows the Winograd band copy prefetches (0: none; see ``winograd.lower_winograd``).
    # Measured (1 thread, kernel CPU time, 20-30 interleaved runs against 0, load 4): PP-OCRv4 det's 96 -> 24 F(4x4)
    # convolutions over 160x160 (9.8 MB inputs) 0.79x and 0.86x, its 80x80 one 0.90x, the model 27.9 -> 25.7 ms;
    # the same conv alone 0.81x (2 channels ahead 0.83x); yolo_block's 3x3 ones 0.95-0.97x; resnet18's, whose inputs
    # sit in L2, within the noise (+-8% at that load). Without the copy at all (wrong results, a bound): 0.66x.
    winograd_band_prefetch: int = 1
    # With ``winograd_avx512``, where 8 x 32 pads the tiles more than AVX2's 6 x 16 (16 tiles, a 14x14 output):
    # MR x 16 in zmm (``winograd.WINOGRAD_ZMM_ROWS``: 16 x 16 for 256 channels) instead of 6 x 16 in ymm, the
    # same panel width at twice the lanes per FMA (the micro-kernel alone on the Zen 5 host, K = 256: 16 x 16 zmm
    # 178 GFLOP/s, 6 x 16 ymm 108). Measured there (1 thread, kernel CPU time, 30-40 interleaved runs against
    # False, load 12-13): r18.l3 (256 ch, 14x14) 0.73-0.78x; in resnet18 layer3's four 3x3 convolutions 0.70-0.72x,
    # the model 0.93x; resnet8 (16 tiles at 8x8: stack2/stack3's conv2) 0.74-0.78x, the model 0.90x. False: AVX2's
    # block there.
    winograd_zmm_panels: bool = True
    # A parallel Winograd loop whose blocks leave a last round with fewer blocks than threads (at a thread
    # count of ``balance_threads``) splits those blocks' output channels across the threads, as it splits a
    # single block (``winograd.last_round_split``; each part transforms the block's input again): resnet18's
    # 56x56 layers are 7 blocks (6 of 32 tiles and one of 4, its GEMMs padded to 32), which 2 threads ran
    # in 4 rounds against 3 (bound 1.75); split, the last block's halves even them out (bound 2.0). The
    # split is chosen at run time by the thread count: one thread runs every block whole. Same bits.
    winograd_split_last_round: bool = True
    # A single Winograd block split by output channels for the threads (resnet18's 14x14 layers: one block of 16
    # tiles, 2 parts on 2 threads) transforms its input once, in one parallel region: the threads share out the
    # input channels into one V (thread 0's scratch), then, after the barrier, run the parts' GEMMs and output
    # transforms (``winograd.lower_winograd``). Before, every part transformed the whole input itself, which at 2
    # threads was the transform's whole time on each thread (4 parts instead of 2 cost ~0.11 ms more per layer3
    # convolution). One thread runs the plain loop. Same bits.
    winograd_shared_transform: bool = True
    # Winograd's batched GEMMs prefetch their packed transformed weights (U, the micro-kernel's A) this many bytes
    # ahead of the line they read, one line a k step (0: none, the hardware's stream prefetcher alone). U is 4x the
    # weights (F(4x4)) and streams from memory: resnet18's are 40 MB, its layer3 convolutions 9.4 MB each. On the
    # Zen 5 host (resnet18, per-kernel medians of 20 interleaved rounds, SCHED_FIFO, load 5-6, others' memory
    # traffic beside it), the ten Winograd kernels against 0: 12288 bytes 1 thread -12%, 2 threads -19%;
    # 2-4 KB (64 k steps), 4096 and 24576 bytes gained about as much (each against 0; 4096 and 24576 against
    # 12288 within 3%). On the AVX-512 (Sapphire Rapids-class) host 2048 bytes, 32 k steps of a 16-row panel: the
    # prefetched lines 12288 bytes ahead, three to each L1 set, crowd out V[xi] (32 KB in layer4), which the next
    # panel reads again. resnet18 (per-kernel medians of 15 interleaved rounds, an onnxruntime run between), 2048
    # against 12288: fused 1 thread 17.43 -> 16.11 and 17.12 -> 16.06 ms, 2 threads 9.96 -> 9.60 (layer4's F(2x2)
    # 1459-1489 -> 1104-1143 us at 1 thread, 820-834 -> 698-733 at 2; layer3's F(4x4) 853-930 -> 754-805), the
    # unfused build 17.82 -> 16.58 and 10.28 -> 9.87; 4096 about half as good, 1024 between, 0 1.22x. Same bits.
    winograd_prefetch_u: int = 2048
    # ... where U is at least this many bytes (packed, output channels padded to the register block): a smaller U
    # (resnet8's 36-256 KiB, yolo_block's 36 KiB) stays in the caches from one run to the next, and the prefetch
    # would be one more instruction a k step for nothing (there within +-2% either way); resnet18's are 576 KiB
    # (layer1, 1 thread -5% with it) to 9 MiB. The kernel's notes say which, with U's size.
    winograd_prefetch_min_bytes: int = 512 << 10
    # Whether the batched GEMMs on the stored U also prefetch their B (V, the transformed input, ``gemm_prefetch``
    # k steps ahead) as the other GEMMs do. V[xi] is the same for every panel of output channels (16-32 KB), so the
    # prefetch looks like a load slot a k step for nothing, and off it measured faster in the fused resnet18 (AVX-512
    # host, per-kernel medians of 25 rounds, an onnxruntime run between, both orders: 1 thread 17.56 -> 16.67 ms and
    # 17.67 -> 16.92, layer4's F(2x2) 1441-1500 -> 1211-1343 us each; 2 threads 9.91 -> 9.95; yolo_block and resnet8
    # unchanged). But the unfused build, whose three layer4 convolutions run through one function on their own U,
    # went 1403 -> 1614, 1417 -> 1237 and 1425 -> 1582 us (15 rounds): without the prefetch each layer's time depends
    # on where its U lies (in ``opfuse bench --groups`` the fused layer4 1233-1288 us against the unfused 1584-1606),
    # the U lines prefetched 12288 bytes ahead crowding V out of L1 (``winograd_prefetch_u``, now 2048, with which
    # off measured no better: fused 16.29 against 16.47 ms, unfused 16.75 against 16.83). So on; off for
    # experiments. The GEMMs computing U from the weights prefetch V either way. Same bits.
    winograd_prefetch_v: bool = True
    # In the region where the threads share one block's output channels (``winograd_shared_transform``: resnet18's
    # 14x14 layers, U 9.4 MB each), where U would be at least ``winograd_u_from_weights_min_bytes`` and at least
    # ``winograd_u_from_weights_min_ratio`` times the 3x3 weights (F(4x4): 4; F(2x2): 16/9), each thread computes
    # the U of its panels of MR output channels from the weights (``winograd.emit_u_panel``; packed per panel, a
    # quarter of U's bytes) a chunk of input channels at a time, each chunk's GEMMs right after, instead of
    # streaming U from memory: about a sixth more arithmetic (F(4x4): ~113 vector operations a channel and panel
    # against the GEMMs' 576 multiply-adds). One thread streams the stored U, computed the same way in float32
    # (``filter_transform_float32``), so every thread count gives the same bits (within a few ulp of the float64 U).
    # resnet18 at 2 threads: layer3's three 556-567 -> 472-478 us with the 12 KB U prefetch of before, 525-534 ->
    # 514-523 with 2048 bytes (571-595 -> 506-523 with the caches flushed, the C harness); at 1 thread computing U
    # measured 3-8% slower with the caches as ``opfuse bench`` leaves them (15% faster with them flushed), and
    # layer4's F(2x2) slower at both (1450 -> 1720 us, 830 -> 880): hence one thread and the ratio. Numbers in the
    # README.
    winograd_u_from_weights: bool = True
    winograd_u_from_weights_min_bytes: int = 4 << 20
    winograd_u_from_weights_min_ratio: float = 3.0
    # ... a chunk of input channels at a time, as many (a multiple of 8) as keep the chunk's U within this many
    # bytes (L1: F(4x4) 16 channels, F(2x2) 40), each chunk's GEMMs right after its transform.
    winograd_u_chunk_bytes: int = 40 << 10
    # The GEMMs computing U from the weights prefetch, at each k step, the row of V the next call (the next xi, same
    # chunk of input channels) reads, instead of ``gemm_prefetch`` rows ahead in the same xi (rows of a chunk the
    # panel's next chunks read, 36 calls later). Same bits.
    winograd_fw_prefetch_next_xi: bool = True
    # ... a row of U at a time (alpha of the alpha^2 xi, ``winograd.emit_u_panel``'s ``row``): per row, the chunks of
    # input channels (their U within ``winograd_fw_group_chunk_bytes``), each chunk's alpha GEMMs right after; the
    # row's M tiles, the chunk's U and its rows of V stay in L1, where all alpha^2 xi a chunk cycled M (36 KB), U and
    # V through L2. The same arithmetic (a row's t-combinations serve that row alone), the same sums.
    winograd_fw_row_groups: bool = True
    winograd_fw_group_chunk_bytes: int = 8 << 10
    # A Winograd block's last panel of tiles short of the micro-kernel's NR runs on narrower micro-kernels (16, then
    # 8 tiles; ``winograd.lower_winograd``'s ``columns``) where they take fewer k steps than one padded NR-tile panel
    # (``winograd._column_tails``): resnet18's 56x56 layers are 196 tiles in blocks of 32, the last 4 now on 8 x 8
    # (layer1 -7% at 1 thread, -9% at 2); its 28x28 ones leave 24 (16 + 8 would take more steps than 32). The same
    # sums. False: the padded panel.
    winograd_column_tails: bool = True
    # Where one block holds every tile of an image and the output rows are whole tiles (OW a multiple of the tile's
    # m), the output transform's bias and epilogue run over each channel's plane as one row
    # (``winograd._flat_plane_epilogue``) instead of row by row: nudenet's 10x10 F(2x2) Conv + SiLU layers ran their
    # SiLU one 10-float vector a row. False: row by row.
    winograd_flat_epilogue: bool = True
    # A fused pointwise loop that reads or writes float16 (or rounds to it between ops) on a target with
    # F16C runs its innermost loop in blocks (``codegen/pointwise.py:emit_f16c_blocks``): F16C converts
    # 8 lanes at a time into and out of float arrays of ``f16c_block`` elements (fewer, a power of two,
    # when the loop is shorter, but at least ``f16c_min_block``; shorter loops keep the portable
    # conversions). Measured (1M-element float16 Relu-Mul-Sigmoid, 1 thread, CPU time, relative to
    # float32 fused): blocks of 128 1.16x, 64 1.26x, 32 1.30-1.39x, 16 2.1-4x and 8 5.6x (gcc unrolls the
    # element loops of 8 and 16 and no longer vectorises them); portable conversions 2.6x, unfused 1.6-1.8x.
    f16c_block: int = 64
    f16c_min_block: int = 32
    # A fused pointwise stage whose operands each vary along its whole innermost loop or not at all (dense, scalar,
    # per channel), over ops with a vector form, runs as AVX-512 / AVX2 intrinsics op by op (``simdchain.py``), the same
    # bits as the plain C loop gcc vectorises, which if-converts each Relu/Clip ternary into compare-and-mask
    # sequences: chain8_arith (Mul Add Relu Sub LeakyRelu Mul Clip HardSwish) 26 -> 19 loop instructions per 16
    # floats, 4.7 -> 2.9 ms per 16M floats in cache (1 thread, CPU time); chain8 (with a Sigmoid) 51 -> 36, 10.2 ->
    # 7.8 ms. False: gcc's loop everywhere.
    simd_elementwise: bool = True
    # Such a stage over one loop (dense) storing one output of at least this many bytes, in storage none of its
    # operands share, stores it with non-temporal stores (``_mm512_stream_ps``; the plain C path is unchanged), in
    # chunks each fenced by the thread that wrote it (``_mm_sfence``), after a scalar peel to alignment: a regular
    # store reads each line before writing it (write-allocate), 3 x the output's bytes of traffic instead of 2, and an
    # output larger than the last-level cache is evicted before anyone reads it anyway. 16 MiB: half this
    # host's 32 MiB L3 (glibc's memcpy streams above 3/4 of the cache share per thread). Measured (1 thread,
    # CPU time, 15 interleaved runs, 16M floats in and out, fused kernels, regular stores -> streaming):
    # chain8_arith 5.44 -> 4.35 ms, chain8 9.38 -> 8.19 ms (gcc's loop: 6.03 and 10.63).
    stream_store_min_bytes: int = 16 << 20
    # Such a streaming loop (the stage's output at least ``stream_store_min_bytes``, so its inputs come from memory
    # too) prefetches each input it reads densely this many floats ahead of the vectors it loads, one
    # ``prefetcht0`` per 64-byte line (``simdchain._prefetch_lines``), in the first pass of a staged block and in the
    # unrolled loop; the hardware's stream prefetcher alone leaves the loop waiting on memory part of the time.
    # Measured (chain8, 16M floats, fused, 1 thread, kernel timers in thread CPU time, 21 interleaved rounds, four
    # processes, load ~1): 4.60 -> 4.29, 4.96 -> 4.46, 4.01 -> 3.76, 3.60 -> 3.53 ms; 512 floats ahead gained 4%,
    # 2048 9%, 4096 7.5%; ``prefetchnta`` was slower (4.38 -> 5.11 ms), ``prefetcht1`` no change. 0: none.
    stream_prefetch_floats: int = 1024
    # A pointwise stage through one nearest Resize upsampling by integer factors along the last two axes
    # (``resize.nearest_factors``: output ``o`` reads input ``o // s``) or one DepthToSpace (``codegen/rowmaps.py``)
    # visits the output columns as ``sw`` neighbours per input column and finds the input row by a division per
    # output row, instead of the map's index tables or ``/`` and ``%`` per element (a gather gcc did not
    # vectorise); where the stage's one output is the Resize's, each input position is computed once and each
    # output row copied to the ``sh - 1`` rows that repeat it. Same values. Measured on PP-OCRv4's text detector
    # (1 x 3 x 640 x 640, 1 thread, kernel CPU time, 30 interleaved runs, against off; load 3-5): the head's two
    # ConvTranspose shuffles (DepthToSpace + Relu, + Sigmoid) 2989 -> 442 us and 1055 -> 104 us, the FPN's
    # HardSigmoid + Mul + Add + 2x Resize + Add 1732 -> 362 us, the Mul + Add + 2x-8x Resize groups 0.19-0.37x;
    # the model 33.7 -> 26.8 ms.
    row_maps: bool = True
    # A Softmax over an axis other than the last, with at least ``norm.SOFTMAX_COLUMNS`` positions after it, runs
    # that many columns at a time, one per lane (``norm._softmax_columns``), instead of a strided row at a time.
    # NudeNet's (YOLOv8n) DFL Softmax, 16 bins at stride 8400 (1 thread, kernel CPU time, 40 interleaved runs,
    # load 1.6): 403 -> 71 us, the model 9.22 -> 8.84 ms; the same bits there (an axis of 16 sums in the same order).
    softmax_columns: bool = True
    # Such a stage's vector loop computes this many vectors per iteration (the leftover vectors one at a time): the
    # independent chains of an exp-based op (Sigmoid: ~60 cycles from load to store) overlap in the core's window
    # instead of waiting in order. Measured (16K floats in cache, 1 thread, CPU time, best of 15): Sigmoid alone
    # 0.146 -> 0.124 ns per element at 4 vectors. 1: one vector per iteration.
    simd_unroll: int = 4
    # A dense such stage (one loop) with one Sigmoid or Silu whose input it computes runs in blocks of this many
    # floats, each in two passes through two stack buffers in L1: the Sigmoid's input and its exp(-|x|) for the whole
    # block, then its division and the rest of the chain (the same operations, so the same bits). In one pass each
    # vector's ~90-cycle chain from load to store (the ops before the Sigmoid, exp's dependent steps, the division)
    # fills the core's window: chain8 ran ~14.5 cycles per 16 floats where its ~25 vector operations need ~7.
    # Measured (Zen 5, 1 thread, CPU time, medians of 41 interleaved rounds, load 11-13): chain8 over 16K floats in
    # cache 0.262-0.266 -> 0.222-0.225 ns per element, over 16M floats (streaming stores, huge pages) 5.02-5.19 ->
    # 4.44-4.58 ms; Mul Add Mul(Sigmoid) (a scale, a shift, SiLU) 0.193-0.197 -> 0.180; a lone Sigmoid, whose input
    # is loaded, 0.150 -> 0.166 with blocks, so it keeps one pass. 0: one pass always.
    simd_stage_block: int = 512
    # Silu (x sigmoid(x)) as ``x / (1 + exp(-x))`` (``vecmath.opfuse_siluf``: one division, nothing after it) instead
    # of ``x * sigmoid(x)`` (sigmoid's |x|, select and division, then the multiply): 2 vector operations fewer (16
    # against 18, one of them on the FMA pipes), one rounding fewer. In every path that computes a Silu op: the
    # scalar rule, the explicit-SIMD chains and epilogues, the storing micro-kernel. Off: ``x * sigmoid(x)``, as
    # before (the Cortex-M7 options keep it, so its C stays as it was, and so does ``PORTABLE``, its host twin).
    # Error 2.31 ulp (2.38 plain C99) from -88.7 up, against 2.97 from -87.3 (4.05 down to -88.7). Measured
    # (yolo_block fused, 1 thread, kernel timers in thread CPU time, 100 interleaved rounds against off, load 2.2):
    # its six Conv + SiLU groups 770 -> 757 us (the 1x1 convolutions' micro-kernel -4.3 and -4.6 us, the Winograd
    # output transforms -0.2 to -2.6 us).
    silu_direct: bool = True
    # exp(x) for x <= 0 (``vecmath.opfuse_expf_nonpos``: Sigmoid, SiLU, Tanh, Softplus, Gelu(tanh)) by a 16-entry table
    # of 2^(j/16) and its float32 tail (two ``vpermps``) and a degree-3 polynomial instead of the degree-6 one, in the
    # scalar helper and its vector forms alike (the same bits: all 2^32 inputs checked; 0.77 ulp against 0.88 / 1.12).
    # In cache, 1 thread, CPU time, medians of 9 interleaved rounds (Zen 5, load 15): Sigmoid 0.125 -> 0.113 ns per
    # element, SiLU 0.137 -> 0.125, Tanh 0.235 -> 0.218, Softplus 0.76 -> 0.69, Gelu(tanh) 0.247 -> 0.223, the
    # chain8 benchmark 0.183 -> 0.181 (one table without the tail: Sigmoid -18%, but 1.00 ulp and Sigmoid 3.00 ulp).
    # Off by default: gcc's loop over the scalar helper (depthwise epilogues, ops without a vector form such as Mish,
    # ``simd_elementwise=False``) does not vectorise the table reads (no gather on this tuning: lane inserts), Sigmoid
    # 0.200 -> 0.882 ns there (load 18).
    exp_table: bool = False
    # float Gelu (erf form) in the loops the C compiler vectorises itself by ``codegen/gelu.py``'s table polynomial too,
    # the bits of its vector forms (which the explicit-SIMD loops, their remainders and the storing micro-kernel use
    # whatever this says). Off by default: gcc reads the table lane by lane there (no gather on this tuning), where it
    # vectorises ``0.5 x (1 + erf(x / sqrt 2))``: a depthwise 3x3 + Gelu kernel (64 x 200 x 152, its epilogue gcc's
    # loop) 10.3 against 1.6 ms (1 thread, CPU time, medians of 41 interleaved rounds, load ~1.2). On for a target that
    # runs no vectoriser (7 multiply-adds and 7 loads against erf's 26 multiply-adds), and for tests that compare the
    # vector forms bitwise with the C loops.
    scalar_gelu_table: bool = False
    # "blob": weights passed as one pointer at run time; "embed": a static const array.
    weights: str = "blob"
    # Time every kernel call (clock_gettime around it); read back with CompiledModel.profile. On the
    # mcu platform: call ``opfuse_kernel_mark(group)`` before the first kernel (-1) and after each one,
    # which the test firmware defines to read its instruction-counting timer (runtime/mcu_support).
    profile: bool = False
    # The clock of those host timers (``PROFILE_CLOCKS``): "wall" (CLOCK_MONOTONIC) or "thread_cpu"
    # (CLOCK_THREAD_CPUTIME_ID: the CPU time of the calling thread, which runs every kernel of a
    # 1-thread build). On a shared machine the wall clock of a kernel includes the time other
    # processes held its core: at a load average of 13 on this 2-core host, bert_layer's
    # attention_output_matmul took 1.45 ms in one build and 9.5 ms in the other (medians of 20).
    # The CPU time does not count that; it still counts what they did to the caches.
    profile_clock: str = "wall"
    platform: str = "host"
    # Tests and the fuzzer (host builds): every scratch region a kernel reserves (``KernelContext.scratch``) gets
    # a guard of this many bytes after it (from its exact end, so the alignment padding too) and one before the
    # first; ``opfuse_run`` fills a kernel's guards with 0xA5 in every thread's scratch before the call and checks
    # them after it, and a changed byte is the fault "kernel ... stored outside its scratch regions or output
    # tensors". A region sized too small for what the kernel writes otherwise lands in the next region, which that
    # kernel has yet to fill or has done with, and no result shows it. 0: none (the default: the same C as without).
    scratch_guard_bytes: int = 0
    # The same for the arena (tests and the fuzzer, host builds): the memory plan places every arena block as if
    # this many bytes longer (``plan_memory``'s ``guard_bytes``: the bytes after a block are its own while it
    # lives), and ``opfuse_run`` fills the guards of the blocks a kernel writes before its call and checks them
    # after it: a kernel storing past the end of a tensor, into one that is dead at that point (no output shows
    # it) or live, is the fault "kernel ... stored outside its scratch regions or output tensors". 0: none.
    arena_guard_bytes: int = 0

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise OpfuseError(f"layout {self.layout!r} is not supported by the C backend (supported: "
                              f"{', '.join(LAYOUTS)})")
        if self.platform not in PLATFORMS:
            raise OpfuseError(f"platform {self.platform!r}: expected one of {', '.join(PLATFORMS)}")
        if self.weights not in WEIGHT_MODES:
            raise OpfuseError(f"weights mode {self.weights!r}: expected one of {', '.join(WEIGHT_MODES)}")
        if self.scratch_guard_bytes < 0 or self.scratch_guard_bytes % 64:
            raise OpfuseError(f"scratch_guard_bytes must be a non-negative multiple of 64, "
                              f"got {self.scratch_guard_bytes}")
        if self.arena_guard_bytes < 0 or self.arena_guard_bytes % 64:
            raise OpfuseError(f"arena_guard_bytes must be a non-negative multiple of 64, got {self.arena_guard_bytes}")
        if (self.scratch_guard_bytes or self.arena_guard_bytes) and self.platform != "host":
            raise OpfuseError("scratch_guard_bytes and arena_guard_bytes are for host builds (the microcontroller's "
                              "scratch lives in its arena)")
        if self.profile_clock not in PROFILE_CLOCKS:
            raise OpfuseError(f"profile clock {self.profile_clock!r}: expected one of {', '.join(PROFILE_CLOCKS)}")
        if self.simd not in SIMD_MODES:
            raise OpfuseError(f"simd mode {self.simd!r}: expected one of {', '.join(SIMD_MODES)}")
        if self.winograd not in WINOGRAD_MODES:
            raise OpfuseError(f"winograd mode {self.winograd!r}: expected one of {', '.join(WINOGRAD_MODES)}")
        if self.gemm_register_activations not in REGISTER_ACTIVATION_MODES:
            raise OpfuseError(f"gemm_register_activations {self.gemm_register_activations!r}: expected one of "
                              f"{', '.join(REGISTER_ACTIVATION_MODES)}")
        if self.gemm_pack_windows not in PACK_WINDOWS_MODES:
            raise OpfuseError(f"gemm_pack_windows {self.gemm_pack_windows!r}: expected one of "
                              f"{', '.join(PACK_WINDOWS_MODES)}")
        if self.depthwise_chunk_planes < 1 or self.depthwise_min_chunks < 1:
            raise OpfuseError("depthwise_chunk_planes and depthwise_min_chunks must be at least 1")
        if self.depthwise_row_block < 1 or self.depthwise_block_group < 1:
            raise OpfuseError("depthwise_row_block and depthwise_block_group must be at least 1")
        if self.depthwise_zmm_row_block < 1 or self.depthwise_zmm_block_group < 1:
            raise OpfuseError("depthwise_zmm_row_block and depthwise_zmm_block_group must be at least 1")
        if not self.depthwise_zmm_plane_rows_max_ratio > 0 or self.depthwise_zmm_plane_min_vectors < 1:
            raise OpfuseError("depthwise_zmm_plane_rows_max_ratio must be above 0 (inf: no plane by this rule) and "
                              "depthwise_zmm_plane_min_vectors at least 1")
        if self.depthwise_prefetch_bytes < 0 or self.depthwise_prefetch_min_stride < 1:
            raise OpfuseError("depthwise_prefetch_bytes must be at least 0, depthwise_prefetch_min_stride at least 1")
        if self.simd_unroll < 1:
            raise OpfuseError("simd_unroll must be at least 1 (1: one vector per iteration)")
        if self.simd_stage_block < 0 or self.simd_stage_block % 16:
            raise OpfuseError("simd_stage_block must be 0 (one pass) or a positive multiple of 16 floats")
        if self.gemm_split_weights_bytes < 0:
            raise OpfuseError("gemm_split_weights_bytes must be at least 0 (0: never split the weights by thread)")
        if self.gemm_next_panel_bytes < 0:
            raise OpfuseError("gemm_next_panel_bytes must be at least 0 (0: never prefetch the next panel)")
        if self.stream_prefetch_floats < 0:
            raise OpfuseError("stream_prefetch_floats must be at least 0 (0: no prefetch)")
        if self.pool_prefetch_bytes < 0:
            raise OpfuseError("pool_prefetch_bytes must be at least 0 (0: no prefetch)")
        if self.f16c_min_block < 8 or self.f16c_min_block % 8 or self.f16c_block < self.f16c_min_block:
            raise OpfuseError("f16c_min_block must be a multiple of 8 and f16c_block at least f16c_min_block")
        if self.vector_isa not in VECTOR_ISAS:
            raise OpfuseError(f"vector ISA {self.vector_isa!r}: expected one of {', '.join(VECTOR_ISAS)}")
        if self.conv_direct_vectors not in (1, 2):
            raise OpfuseError("conv_direct_vectors must be 1 or 2 (vectors of conv_direct_nr positions)")
        if self.gemm_k_unroll < 0:
            raise OpfuseError("gemm_k_unroll must be at least 0 (0 or 1: the k loop as gcc decides)")
        if self.gemm_mr < 0 or self.gemm_nr < 0:
            raise OpfuseError("gemm_mr and gemm_nr must be positive (0: the vector ISA's register block)")
        if self.gemm_pack_prefetch_locality not in (0, 1, 2, 3):
            raise OpfuseError(f"gemm_pack_prefetch_locality ({self.gemm_pack_prefetch_locality}) must be 0-3 "
                              f"(__builtin_prefetch's locality)")
        mr, nr = self.gemm_mr, self.gemm_nr
        if (mr and self.gemm_mc % mr) or (nr and self.gemm_nc % nr):
            raise OpfuseError(f"gemm_mc ({self.gemm_mc}) must be a multiple of gemm_mr ({mr}) and gemm_nc "
                              f"({self.gemm_nc}) of gemm_nr ({nr})")

    def with_(self, **kw) -> "CodegenOptions":
        return replace(self, **kw)

    def resolved(self, host_isa: str, full_width_fma: bool = False) -> "CodegenOptions":
        """These options with ``vector_isa`` concrete ("host" -> ``host_isa``) and the register
        block filled in from it. The plain C build (simd="none") keeps the AVX2 block where none
        is given, so its results do not depend on the machine that generated it. ``full_width_fma``
        (the host's, ``opfuse.targets.host_full_width_fma``) decides ``winograd_avx512``, ``windows_mr_max``,
        ``depthwise_avx512`` and ``attention_vector_width_512`` where they are None."""
        isa = host_isa if self.vector_isa == "host" else self.vector_isa
        if self.simd == "none":
            isa = "avx2"
        mr, nr = REGISTER_BLOCKS[isa]
        wino = full_width_fma if self.winograd_avx512 is None else self.winograd_avx512
        windows_mr = (WINDOWS_MR_MAX_FULL_WIDTH if full_width_fma else WINDOWS_MR_MAX) \
            if self.windows_mr_max is None else self.windows_mr_max
        dw = full_width_fma if self.depthwise_avx512 is None else self.depthwise_avx512
        aw = full_width_fma if self.attention_vector_width_512 is None else self.attention_vector_width_512
        return replace(self, vector_isa=isa, gemm_mr=self.gemm_mr or mr, gemm_nr=self.gemm_nr or nr,
                       winograd_avx512=wino, windows_mr_max=windows_mr, depthwise_avx512=dw,
                       attention_vector_width_512=aw)


ONE_THREAD = 1 << 62  # a ``parallel_min_work`` no loop reaches: every loop on one thread

# Cortex-M7: one thread, no cache worth blocking for, 32 single-precision registers. The 4 x 4
# micro-kernel (scalar accumulators, plain C99: ``simd="none"``) keeps 16 accumulators, 4 values
# of A and one of B in S0-S31. The tile and panel limits bound the kernels' scratch, which lives
# in the arena here: with the host's (a 128 KiB C tile, 512-wide panels) resnet8's arena was
# 360 KiB and mobilenet_v1_025_96's 543 KiB; with these, 140 and 217.5 KiB, for 1-2% more
# executed instructions than 1024-float tiles and 64-wide panels (148.5 and 217.5 KiB). Measured
# under QEMU on resnet8, mobilenet_v1_025_96 and ds_cnn. No loop is worth threads: no OpenMP. The
# direct convolution kernel (host-tuned, its C tile alone 64 KiB of scratch) is off.
CORTEX_M7 = CodegenOptions(platform="mcu", weights="embed", simd="none", gemm_scalar_accumulators=True,
                           gemm_mr=4, gemm_nr=4, gemm_mc=64, gemm_nc=16, gemm_kc=64, gemm_wide=32,
                           gemm_tile_floats=512, gemm_min_tiles=1, parallel_min_work=ONE_THREAD,
                           int8_conv_positions_per_pass=2, int8_conv_channels_per_pass=4,
                           int8_dot_call_min_pairs=65, conv_direct_max_k=0, silu_direct=False)
# The host build without intrinsics: the plain C99 the microcontroller runs, so the emulated
# Cortex-M7 gives the same bits as this (AVX2 FMA rounds once per multiply-add, the C twice).
PORTABLE = CodegenOptions(simd="none", silu_direct=False)
TARGET_OPTIONS = {"cortex-m7": CORTEX_M7}


def options_for_target(target: str) -> CodegenOptions:
    """The code generator's options for a compilation target (the host's defaults otherwise)."""
    return TARGET_OPTIONS.get(target, CodegenOptions())
