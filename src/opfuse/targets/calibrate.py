"""The ``host`` profile: this machine, either calibrated explicitly or nominal.

Planning never measures anything. ``host_profile()`` (what ``get_profile("host")``
returns) is

* the **saved calibration**, when ``opfuse profile --target host --calibrate``
  (``calibrate_host(force=True)``) has written one to the cache directory and it was made
  on this machine with this calibration version (the *fingerprint*: CPU model, CPU count,
  architecture, compiler); or else
* the **nominal host profile** (``nominal_host_profile()``): fixed bandwidth, FLOP/s,
  call overhead and latency constants (``NOMINAL_HOST_*`` below), plus the structural facts
  read from ``/sys`` and ``/proc`` (cache size, line size, vector ISA, NUMA), which involve
  no timing. Its notes say why it was used (no calibration saved, or one for another
  machine or compiler).

A timing calibration varies from run to run on a shared machine (bandwidth 19-29 GB/s,
float32 GEMM 52-61 GFLOP/s across six runs on the development machine), and the planner's
choice follows those numbers: ResNet-8 got two different plans, so two different
``model.c``, from two calibrations. Measuring implicitly on first use made the generated C
depend on whichever run happened to fill the cache; now it depends only on the saved
calibration a user made on purpose (and which ``opfuse compile`` names).

``calibrate_host()`` returns the saved calibration when valid, else measures
(``opfuse.targets.microbench``) and saves it atomically; ``force=True`` always re-measures.
Calibrations hold a lock (``host_profile.json.lock``): two processes calibrating at once
measure one after the other, and without ``force`` the second uses the first's result.

What is measured and what is read from the OS:

* measured: memory bandwidth, peak FLOP/s (float32, float64; float16 and int8 are listed at
  the float32 figure because generated C computes them in float32), per-kernel call
  overhead, DRAM latency (a pointer chase);
* derived: memory-level parallelism by Little's law, ``lines in flight = B * latency / line``;
* from ``/sys`` and ``/proc``: the last-level cache share per core (on-chip capacity), the
  cache-line size, the vector ISA (register file and vector width), NUMA nodes and their
  SLIT distances (remote latency = local latency x distance ratio).
"""
from __future__ import annotations

import contextlib
import functools
import os
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from opfuse.errors import StorageError
from opfuse.files import file_lock, private_dir
from opfuse.targets.cache import atomic_write_json, cache_dir, read_json_or_none
from opfuse.targets.microbench import (FULL, BenchSizes, Measurement, compiler_version, find_compiler,
                                       measure_with_c, measure_with_numpy)
from opfuse.targets.profile import HardwareProfile, ProfileError

CALIBRATION_VERSION = 1
CACHE_FILE = "host_profile.json"
SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")
DEFAULT_ONCHIP_BYTES = 1 << 20  # when /sys does not say
DEFAULT_LINE_BYTES = 64
DEFAULT_DRAM_LATENCY_S = 1e-7  # when it was not measured (NumPy fallback)
SLIT_LOCAL_DISTANCE = 10  # ACPI SLIT: the distance of a node to itself
CALIBRATE_COMMAND = "opfuse profile --target host --calibrate"
CALIBRATED_NOTE = "calibrated"  # the first note of a saved calibration: "calibrated <when> by ..."

# The nominal host (no saved calibration): one core of the development machine (AMD EPYC,
# 2 vCPUs, gcc 12.2 -O3 -march=native), rounded from six runs of the micro-benchmarks
# (opfuse.targets.microbench, FULL sizes): STREAM scale 18.6-28.8 GB/s, register-blocked
# GEMM 51.6-60.7 GFLOP/s float32 and ~31 GFLOP/s float64, an empty kernel call through a
# pointer ~1.9 ns, a pointer chase ~170 ns per hop. Constants, so plans never depend on a
# timing run; a desktop core is within ~2x of each.
NOMINAL_HOST_BANDWIDTH_BPS = 22e9
NOMINAL_HOST_FP32_FLOPS = 60e9
NOMINAL_HOST_FP64_FLOPS = 30e9
NOMINAL_HOST_CALL_OVERHEAD_S = 2e-9
NOMINAL_HOST_DRAM_LATENCY_S = 1.7e-7
NOMINAL_SOURCE = "nominal"

MeasureFn = Callable[[], Measurement]


# Facts from the OS ------------------------------------------------------------------------

def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _parse_size(text: str) -> int | None:
    """'32768K' / '1M' / '512' -> bytes."""
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * mult if digits.isdigit() else None


def _cpu_count_in(cpu_list: str) -> int:
    """'0-3,8' -> 5."""
    count = 0
    for part in cpu_list.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit():
            count += (int(hi) - int(lo) + 1) if hi.isdigit() else 1
    return max(1, count)


def onchip_share() -> tuple[int, str]:
    """The last-level cache divided by the CPUs sharing it, and how it was found."""
    best: tuple[int, int, int] | None = None  # (level, size, sharers)
    for idx in sorted((SYS_CPU / "cpu0" / "cache").glob("index*")):
        kind, level, size = _read(idx / "type"), _read(idx / "level"), _read(idx / "size")
        if kind == "Instruction" or not (level and size and level.isdigit()):
            continue
        nbytes = _parse_size(size)
        sharers = _cpu_count_in(_read(idx / "shared_cpu_list") or "0")
        if nbytes and (best is None or int(level) > best[0]):
            best = (int(level), nbytes, sharers)
    if best is None:
        return DEFAULT_ONCHIP_BYTES, "default (no cache information in /sys)"
    top, total, shared_by = best
    return total // shared_by, f"L{top} {total >> 10} KiB shared by {shared_by} CPU(s)"


def cache_line_bytes() -> int:
    text = _read(SYS_CPU / "cpu0" / "cache" / "index0" / "coherency_line_size")
    return int(text) if text and text.isdigit() else DEFAULT_LINE_BYTES


@functools.lru_cache(maxsize=None)
def _cpuinfo() -> dict[str, str]:
    """/proc/cpuinfo's fields, each name's first value in file order (the first CPU's); empty where it cannot
    be read."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_flags() -> frozenset[str]:
    """The first CPU's feature flags in /proc/cpuinfo (``avx512f``, ``avx512_vnni``, ...); empty where unreadable."""
    return frozenset(_cpuinfo().get("flags", "").split())


def cpu_model() -> str:
    for key, value in _cpuinfo().items():
        if key.lower().startswith(("model name", "hardware", "cpu model")):
            return value
    return platform.processor() or platform.machine()


def vector_isa() -> tuple[int, int, str]:
    """(register file bytes, vector bytes, ISA name) of the widest vector ISA present."""
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return 32 * 16, 16, "NEON (32 x 128-bit)"
    flags = cpu_flags()
    if "avx512f" in flags:
        return 32 * 64, 64, "AVX-512 (32 x 512-bit)"
    if "avx" in flags:
        return 16 * 32, 32, "AVX (16 x 256-bit)"
    return 16 * 16, 16, "SSE2 (16 x 128-bit)"


@functools.lru_cache(maxsize=None)
def host_simd_isa() -> str:
    """The code generator's name for this CPU's widest vector ISA (what the host profile's
    ``vector_bytes`` says): "neon" on an aarch64 host, "avx512" where an x86 CPU has AVX-512F, else "avx2"."""
    return simd_isa_of(platform.machine(), vector_isa()[1])


@functools.lru_cache(maxsize=None)
def host_full_width_fma() -> bool:
    """Whether this CPU multiply-adds a whole zmm register per FMA pipe (``full_width_fma_of`` on
    /proc/cpuinfo's vendor, family and flags)."""
    fields = _cpuinfo()
    return full_width_fma_of(fields.get("vendor_id", ""), fields.get("cpu family", ""), fields.get("flags", ""))


# AMD's first family whose 512-bit FMAs run in full-width pipes (Zen 5, family 26 = 0x1A); Zen 4 (family
# 25) splits each into two 256-bit halves, so a zmm multiply-add there costs what two ymm ones do.
AMD_FULL_WIDTH_FAMILY = 26
# Intel: flags only the server cores from Sapphire Rapids on have (AMX, AVX512-FP16), each with two 512-bit FMA
# pipes (port 0+1 fused and port 5). Cpuinfo's model number is no guide in a VM (a Sapphire Rapids-class guest
# here reported family 6 model 167, a client Rocket Lake's). Measured on that guest (1 thread, CPU time): the
# 8 x 32 zmm micro-kernel 180 GFLOP/s against 112 for the 6 x 16 ymm one (zmm runs at a lower clock), and the
# options this decides on, against off: resnet18 0.90x, mobilenet_v1 0.97x (kernel CPU time, interleaved).
# Earlier Xeons (Skylake-SP to Ice Lake-SP) have one or two such pipes by SKU and stay "not known".
INTEL_FULL_WIDTH_FLAGS = ("amx_tile", "avx512_fp16")


def full_width_fma_of(vendor: str, family: str, flags: str) -> bool:
    """Whether a CPU (cpuinfo's ``vendor_id``, ``cpu family`` and ``flags``) has AVX-512F and FMA pipes as
    wide as a zmm register, so 512-bit code doubles the peak of 256-bit code: AMD from Zen 5 on, Intel's
    server cores from Sapphire Rapids on (``INTEL_FULL_WIDTH_FLAGS``). False where it is not known to (Zen 4;
    Intel's client cores, which fuse two 256-bit ports into one zmm pipe; earlier Xeons)."""
    words = set(flags.split())
    if "avx512f" not in words:
        return False
    if vendor == "AuthenticAMD":
        return family.isdigit() and int(family) >= AMD_FULL_WIDTH_FAMILY
    return vendor == "GenuineIntel" and any(f in words for f in INTEL_FULL_WIDTH_FLAGS)


def simd_isa_of(machine: str, vector_bytes: int) -> str:
    """``host_simd_isa`` of a machine name (``platform.machine()``) and its vector width in bytes."""
    machine = machine.lower()
    if machine in ("aarch64", "arm64"):
        return "neon"
    return "avx512" if vector_bytes >= 64 and machine in ("x86_64", "amd64") else "avx2"


def numa_topology() -> tuple[int, float]:
    """(number of NUMA nodes, remote/local latency ratio from the SLIT distances)."""
    nodes = sorted(p for p in SYS_NODE.glob("node[0-9]*") if p.name[4:].isdigit())
    if not nodes:
        return 1, 1.0
    dist = (_read(nodes[0] / "distance") or "").split()
    ratio = 1.0
    if len(dist) > 1 and all(d.isdigit() for d in dist):
        local = int(dist[0]) or SLIT_LOCAL_DISTANCE
        ratio = max(int(d) for d in dist) / local
    return len(nodes), ratio


def fingerprint(compiler: str | None) -> dict:
    return {"calibration_version": CALIBRATION_VERSION, "machine": platform.machine(),
            "cpu": cpu_model(), "cpus": os.cpu_count() or 1,
            "compiler": compiler_version(compiler) if compiler else "none (numpy)"}


# Measurement -> profile ---------------------------------------------------------------------

def default_measure(sizes: BenchSizes = FULL) -> Measurement:
    cc = find_compiler()
    if cc is not None:
        try:
            return measure_with_c(cc, sizes)
        except (RuntimeError, OSError) as e:  # a broken toolchain: measure what NumPy sees
            m = measure_with_numpy(sizes)
            return Measurement(m.bandwidth_Bps, m.peak_flops, m.call_overhead_s, m.dram_latency_s,
                               f"numpy (C compiler failed: {str(e).splitlines()[0][:120]})")
    return measure_with_numpy(sizes)


def profile_from_measurement(m: Measurement) -> HardwareProfile:
    onchip, onchip_how = onchip_share()
    regs, vec, isa = vector_isa()
    nodes, ratio = numa_topology()
    line = cache_line_bytes()
    latency = m.dram_latency_s if m.dram_latency_s else DEFAULT_DRAM_LATENCY_S
    mlp = max(1, round(m.bandwidth_Bps * latency / line))  # Little's law
    fp32 = m.peak_flops["float32"]
    peaks = dict(m.peak_flops)
    peaks.setdefault("float16", fp32)
    peaks.setdefault("int8", fp32)
    return HardwareProfile(
        name="host", peak_flops=peaks, mem_bandwidth=m.bandwidth_Bps, onchip_bytes=onchip,
        register_bytes=regs, vector_bytes=vec, launch_overhead_s=m.call_overhead_s,
        numa_nodes=nodes, numa_local_latency_s=latency, numa_remote_latency_s=latency * ratio,
        cache_line_bytes=line, memory_parallelism=mlp, calibrated=True, source=m.method,
        notes=(f"CPU: {cpu_model()}, one core",
               f"on-chip = {onchip_how}", f"vector ISA: {isa}",
               "float16/int8 listed at the float32 GEMM rate (generated C computes them in float32)",
               "latency: pointer chase" if m.dram_latency_s else "latency: not measured (default)",
               f"memory parallelism {mlp} lines in flight = bandwidth x latency / line (Little's law)"),
    )


def nominal_host_profile(reason: str = "no saved calibration") -> HardwareProfile:
    """The host profile used when no valid calibration is saved: the ``NOMINAL_HOST_*``
    constants and the OS's structural facts. Deterministic: nothing is timed."""
    m = Measurement(bandwidth_Bps=NOMINAL_HOST_BANDWIDTH_BPS,
                    peak_flops={"float32": NOMINAL_HOST_FP32_FLOPS, "float64": NOMINAL_HOST_FP64_FLOPS},
                    call_overhead_s=NOMINAL_HOST_CALL_OVERHEAD_S, dram_latency_s=NOMINAL_HOST_DRAM_LATENCY_S,
                    method=NOMINAL_SOURCE)
    p = profile_from_measurement(m)
    notes = (f"nominal: {reason}; `{CALIBRATE_COMMAND}` measures this machine and saves it",
             "bandwidth, FLOP/s, call overhead and latency are fixed constants (NOMINAL_HOST_* in "
             "opfuse.targets.calibrate), not measurements",
             *(n for n in p.notes if not n.startswith("latency:")))
    return p.with_overrides(calibrated=False, source=NOMINAL_SOURCE, notes=notes)


def saved_host_calibration(cache_path: Path | None = None) -> tuple[HardwareProfile | None, str]:
    """(the saved calibration, "") when one is valid for this machine, else (None, why not)."""
    path = Path(cache_path) if cache_path is not None else cache_dir() / CACHE_FILE
    if not path.exists():
        return None, "no saved calibration"
    cached = read_json_or_none(path)
    if not isinstance(cached, dict):
        return None, f"the saved calibration {path} is unreadable"
    if cached.get("fingerprint") != fingerprint(find_compiler()):
        return None, f"the saved calibration {path} is for another machine or compiler"
    try:
        return HardwareProfile.from_dict(cached.get("profile") or {}, where=str(path)), ""
    except ProfileError:
        return None, f"the saved calibration {path} is invalid"


def host_profile(cache_path: Path | None = None) -> HardwareProfile:
    """The profile planning uses for ``host``: the saved calibration, else the nominal one.
    Never measures."""
    saved, why = saved_host_calibration(cache_path)
    return saved if saved is not None else nominal_host_profile(why)


def calibrate_host(force: bool = False, *, cache_path: Path | None = None,
                   measure: MeasureFn | None = None) -> HardwareProfile:
    """Calibrate explicitly: the saved calibration when valid (unless ``force``), else
    measure this machine, save the result and return it. Later plans use it
    (``host_profile``). ``measure`` replaces the micro-benchmarks (tests use it to count
    re-measurements)."""
    path = Path(cache_path) if cache_path is not None else cache_dir() / CACHE_FILE
    if not force:
        saved, _ = saved_host_calibration(path)
        if saved is not None:
            return saved
    with contextlib.suppress(StorageError):  # no folder, no lock: the save below says why
        private_dir(path.parent, "cache")
    # One calibration at a time: a process that waited here uses the one just saved.
    with file_lock(path.with_name(path.name + ".lock")):
        if not force:
            saved, _ = saved_host_calibration(path)
            if saved is not None:
                return saved
        from opfuse.progress import step
        with step("calibrating the host (micro-benchmarks)"):
            m = (measure or default_measure)()
        profile = profile_from_measurement(m)
        when = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
        profile = profile.with_overrides(notes=(f"{CALIBRATED_NOTE} {when} by `{CALIBRATE_COMMAND}`", *profile.notes))
        atomic_write_json(path, {"fingerprint": fingerprint(find_compiler()), "profile": profile.to_dict()})
    return profile


def describe_profile(profile: HardwareProfile) -> str:
    """One line: which profile planning used and where its numbers come from."""
    if profile.name == "host" and profile.source == NOMINAL_SOURCE:
        why = profile.notes[0].split(";")[0].removeprefix("nominal: ") if profile.notes else ""
        return f"host profile: nominal constants ({why}; `{CALIBRATE_COMMAND}` to measure this machine)"
    if profile.name == "host" and profile.calibrated:
        when = next((n.split()[1][:10] for n in profile.notes if n.startswith(CALIBRATED_NOTE)), None)
        return (f"host profile: saved calibration{f' of {when}' if when else ''} ({profile.source}; "
                f"`{CALIBRATE_COMMAND}` to redo)")
    if profile.instruction_costs:
        when = next((n.split()[1][:10] for n in profile.notes if n.startswith("fitted")), None)
        return (f"{profile.name} profile: fitted from {profile.source}{f' of {when}' if when else ''} "
                f"(`opfuse profile --target {profile.name} --fit` to redo)")
    return f"{profile.name} profile: {profile.source}" + (" (calibrated)" if profile.calibrated else "")
