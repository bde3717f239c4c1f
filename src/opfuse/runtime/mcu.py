"""The Cortex-M7 backend: export a standalone C library, and run it on an emulated Cortex-M7.

    program = generate_mcu(graph, plan, memory)              # CodegenOptions for cortex-m7
    export_library(program, "out/", compile_report)          # model.c/.h, weights, README, report
    result = run_on_qemu(program, {"input": x})              # outputs, instructions, sizes

Running: the library is linked into a small test firmware (``mcu_support/``: linker script
and vector table for QEMU's ``mps2-an500`` board, reset code that turns the FPU on, and a
harness) with newlib's semihosting start-up (``--specs=rdimon.specs``). The inputs are baked
into the image; the harness prints the outputs as hex words of their bytes on semihosting
stdout, so nothing depends on the emulator's file system and the values come back bit for
bit. QEMU exits with ``main``'s return value and always runs under a timeout.

Counting: QEMU runs with ``-icount shift=ICOUNT_SHIFT``: every instruction advances the
virtual clock by exactly 2^shift ns, and the board's 25 MHz CMSDK timers read that clock, so
``instructions = ticks * 40 ns / 2^shift``. With shift 7 an instruction is 3.2 ticks, so the
count is exact (the rounding error is below a third of an instruction). DWT's cycle counter
is not emulated; Debian's QEMU loads TCG plugins but ships no plugin headers.
"""
from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Mapping

import numpy as np

from opfuse.codegen.ctype import c_type
from opfuse.codegen.mcu import SOURCE_NAME, WEIGHTS_NAME
from opfuse.codegen.options import options_for_target
from opfuse.codegen.program import CProgram, generate
from opfuse.errors import InputError, OpfuseError
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionPlan
from opfuse.memory.plan import MemoryPlan
from opfuse.runtime.reference import check_inputs
from opfuse.runtime.toolchain import ToolchainError

TARGET = "cortex-m7"
CPU_FLAGS = ("-mcpu=cortex-m7", "-mthumb", "-mfpu=fpv5-d16", "-mfloat-abi=hard")
# -ffp-contract=off on both sides (the host build uses it too): no fused multiply-add, so the
# emulated results are bit-identical to the host's portable build (``codegen.options.PORTABLE``).
CFLAGS = CPU_FLAGS + ("-O2", "-std=c99", "-ffp-contract=off", "-fwrapv", "-fno-math-errno", "-ffunction-sections",
                      "-fdata-sections")
LDFLAGS = ("--specs=rdimon.specs", "-Wl,--gc-sections")
QEMU_MACHINE = "mps2-an500"
ICOUNT_SHIFT = 7
TIMER_NS_PER_TICK = 40          # the board's 25 MHz system clock
COARSE_PRESCALE = 256           # dual timer 1
COMPILE_TIMEOUT_S = 300
RUN_TIMEOUT_S = 600
APT_PACKAGES = ("gcc-arm-none-eabi", "libnewlib-arm-none-eabi", "qemu-system-arm")
SUPPORT_FILES = ("mps2_an500.ld", "startup.c", "harness.c")
_MARK = "opfuse-mcu:"


class McuRunError(RuntimeError):
    """The firmware faulted, timed out or printed something unreadable (a bug, not user error)."""


@dataclass(frozen=True)
class McuTools:
    gcc: str
    size: str
    qemu: str


def _missing_tools_message(what: str) -> str:
    return (f"the {TARGET} backend needs {what}: run `make mcu-tools`, or `apt-get install -y "
            f"--no-install-recommends {' '.join(APT_PACKAGES)}`")


@functools.lru_cache(maxsize=1)
def find_tools() -> McuTools:
    """The cross compiler (with newlib) and the emulator; ``ToolchainError`` naming what is missing."""
    found = {name: shutil.which(name) for name in ("arm-none-eabi-gcc", "arm-none-eabi-size", "qemu-system-arm")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise ToolchainError(_missing_tools_message(", ".join(missing)))
    gcc = found["arm-none-eabi-gcc"]
    assert gcc is not None
    specs = subprocess.run([gcc, "-print-file-name=rdimon.specs"], capture_output=True, text=True,
                           timeout=60, check=False).stdout.strip()
    if not Path(specs).is_file():
        raise ToolchainError(_missing_tools_message("newlib (libnewlib-arm-none-eabi)"))
    return McuTools(gcc, str(found["arm-none-eabi-size"]), str(found["qemu-system-arm"]))


def tools_available() -> bool:
    try:
        find_tools()
    except ToolchainError:
        return False
    return True


# Generation and export ---------------------------------------------------------------------

def generate_mcu(graph: Graph, plan: FusionPlan | None, memory: MemoryPlan | None = None, *,
                 marks: bool = False) -> CProgram:
    """The standalone C library of ``graph`` under ``plan`` (unfused when None) for the Cortex-M7;
    ``marks``: count every kernel's instructions when run under QEMU (``McuResult.kernel_instructions``)."""
    options = options_for_target(TARGET)
    return generate(graph, plan, memory=memory, options=options.with_(profile=True) if marks else options)


def _run(cmd: list[str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise McuRunError(f"{Path(cmd[0]).name} did not finish within {timeout:.0f} s") from None


def _compile(tools: McuTools, source: Path, obj: Path, include: Path, *extra: str) -> None:
    proc = _run([tools.gcc, *CFLAGS, *extra, "-I", str(include), "-c", str(source), "-o", str(obj)],
                COMPILE_TIMEOUT_S)
    if proc.returncode != 0:
        errors = "\n".join(proc.stderr.splitlines()[:40])
        raise McuRunError(f"arm-none-eabi-gcc failed on {source.name} (exit {proc.returncode}):\n{errors}")


@dataclass(frozen=True)
class Sizes:
    """``arm-none-eabi-size`` (Berkeley): text (code and constants), data, bss."""

    text: int
    data: int
    bss: int

    @property
    def flash(self) -> int:
        return self.text + self.data

    @property
    def sram(self) -> int:
        return self.data + self.bss


def sizes(tools: McuTools, *files: Path) -> Sizes:
    proc = _run([tools.size, "-B", "--totals", *map(str, files)], 60)
    total = proc.stdout.strip().splitlines()[-1].split()
    return Sizes(int(total[0]), int(total[1]), int(total[2]))


def write_library(program: CProgram, directory: Path) -> list[Path]:
    """``model.c``, ``model.h`` and ``model_weights.c`` in ``directory``."""
    if program.mcu is None:
        raise ValueError("not an mcu program: generate it with generate_mcu")
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in program.mcu.files(program.source).items():
        (directory / name).write_text(text)
        out.append(directory / name)
    return out


@dataclass(frozen=True)
class LibraryBuild:
    """The library alone as the cross compiler builds it: sizes, and the stack frame of every
    function (gcc's ``-fstack-usage``; all static: no alloca, no variable-length arrays)."""

    sizes: Sizes
    frames: dict[str, int]

    @property
    def stack_bound_bytes(self) -> int:
        """``opfuse_run``'s frame plus the deepest kernel's, which calls nothing but inlined
        helpers and libm (whose frames are not counted)."""
        run = self.frames.get("opfuse_run", 0)
        return run + max((b for f, b in self.frames.items() if f != "opfuse_run"), default=0)


def _stack_frames(su: Path) -> dict[str, int]:
    frames = {}
    for line in su.read_text().splitlines():
        where, nbytes, kind = line.split("\t")
        if kind.split(",")[0] != "static":
            raise McuRunError(f"a generated function has a {kind} stack frame: {where}")
        frames[where.rsplit(":", 1)[-1]] = int(nbytes)
    return frames


def measure_library(program: CProgram) -> LibraryBuild | None:
    """Cross-compile the library alone to measure it (None without the cross compiler)."""
    if not tools_available():
        return None
    tools = find_tools()
    with tempfile.TemporaryDirectory(prefix="opfuse-mcu-lib-") as tmp:
        d = Path(tmp)
        write_library(program, d)
        objs = []
        for name in (SOURCE_NAME, WEIGHTS_NAME):
            obj = d / (Path(name).stem + ".o")
            _compile(tools, d / name, obj, d, "-fstack-usage")
            objs.append(obj)
        return LibraryBuild(sizes(tools, *objs), _stack_frames(d / "model.su"))


def mcu_report(program: CProgram, compile_report: Mapping | None = None, built: LibraryBuild | None = None) -> dict:
    """``report.json``: the arena (tensors and scratch), flash, and per-kernel estimates."""
    assert program.mcu is not None
    rep = dict(compile_report or {})
    predicted = {g["name"]: g for g in rep.get("groups", [])}
    kernels = []
    for k in program.kernels:
        g = predicted.get(k.group, {})
        kernels.append({"name": k.group, "kind": k.kind, "ops": k.ops, "function": k.function,
                        "scratch_bytes": k.scratch_bytes, "scratch_offset": k.scratch_offset,
                        "predicted_latency_s": g.get("predicted_latency_s"), "bound": g.get("bound"),
                        "flops": g.get("flops"), "bytes": g.get("bytes_after")})
    weights = len(program.weights)
    lib = built.sizes if built is not None else None
    out = {
        "target": TARGET,
        "model": rep.get("model"),
        "fused": rep.get("fused"),
        "kernels": len(program.kernels),
        "functions": program.num_functions,
        "c_functions": program.c_functions,
        "arena_bytes": program.arena_bytes,
        "arena_tensor_bytes": program.mcu.scratch.tensor_bytes,
        "arena_lower_bound_bytes": program.memory.lower_bound_bytes,
        "scratch_bytes_max": max((k.scratch_bytes for k in program.kernels), default=0),
        "scratch_growth_bytes": program.mcu.scratch.growth_bytes,
        "weights_bytes": weights,
        "subnormal_weights_flushed": program.subnormals_flushed,
        "code_bytes": lib.text - weights if lib is not None else None,
        "flash_bytes": lib.flash if lib is not None else weights,
        "flash_note": ("code and weights, as arm-none-eabi-gcc builds them" if lib is not None else
                       "weights only: arm-none-eabi-gcc was not found to measure the code"),
        "stack_bound_bytes": built.stack_bound_bytes if built is not None else None,
        "stack_frames": built.frames if built is not None else None,
        "predicted_latency_s": rep.get("predicted_latency_s"),
        "main_memory_bytes": rep.get("bytes_after"),
        "kernel_estimates": kernels,
        # Patch-based execution (memory.patch): the runs made, their workspace and recomputation, and
        # the ops that end a run.
        "patching": rep.get("patching"),
    }
    return out


README = """\
# {model}: opfuse for Cortex-M7

Generated by opfuse; do not edit. Portable C99: no malloc, no OS, no threads, and of libc only
`math.h` and `string.h`.

| file | what |
| --- | --- |
| `model.h` | the interface: `opfuse_run`, `OPFUSE_ARENA_BYTES`, input/output sizes |
| `model.c` | {c_functions} kernel functions for {functions} fused groups (one per code) and `opfuse_run` |
| `model_weights.c` | the weights, one `const` array (`opfuse_weights`, {weights} bytes): keep it in flash |
| `report.json` | arena, flash and per-kernel estimates |

## Integrating it

Add `model.c` and `model_weights.c` to the firmware's sources and link with the math library
(`-lm`). Build them with `-ffp-contract=off` to get the same bits as opfuse's host build and
its reference tests, and with `-fwrapv` (integer tensors wrap on overflow, as in ONNX runtimes);
for example, with GCC for a Cortex-M7 with a double-precision FPU:

    arm-none-eabi-gcc -mcpu=cortex-m7 -mthumb -mfpu=fpv5-d16 -mfloat-abi=hard -O2 \\
        -ffp-contract=off -fwrapv -std=c99 -c model.c model_weights.c

The FPU must be enabled before the first call (CPACR bits 20-23; CMSIS `SystemInit` does it).

```c
#include "model.h"

static uint8_t arena[OPFUSE_ARENA_BYTES] __attribute__((aligned(OPFUSE_ARENA_ALIGN)));
static float input[OPFUSE_INPUT0_ELEMENTS];
static float output[OPFUSE_OUTPUT0_ELEMENTS];

int infer(void) {{
    const float *const inputs[] = {{input}};
    float *const outputs[] = {{output}};
    return opfuse_run(inputs, outputs, arena);  /* 0 on success */
}}
```

Memory: the arena ({arena} bytes, in SRAM) holds every intermediate tensor and every kernel's
scratch; its contents need not survive between calls, so it can be shared with other work
between inferences. Inputs are only read; outputs are written in full. The stack stays bounded
(no recursion, no variable-length arrays). Weights are read in place from flash.
"""


def export_library(program: CProgram, directory: str | Path, compile_report: Mapping | None = None) -> list[Path]:
    """Write the library, ``README.md`` and ``report.json`` (flash measured when the cross
    compiler is there)."""
    d = Path(directory)
    files = write_library(program, d)
    rep = mcu_report(program, compile_report, measure_library(program))
    model = (compile_report or {}).get("model") or "model"
    (d / "README.md").write_text(README.format(model=model, functions=program.num_functions,
                                               c_functions=program.c_functions, weights=len(program.weights),
                                               arena=program.arena_bytes))
    (d / "report.json").write_text(json.dumps(rep, indent=1, sort_keys=True, default=str))
    return files + [d / "README.md", d / "report.json"]


# Firmware ---------------------------------------------------------------------------------

def _words(data: bytes) -> list[str]:
    data += b"\0" * (-len(data) % 4)
    words = np.frombuffer(data, dtype="<u4") if data else np.zeros(1, dtype="<u4")
    return [f"0x{w:08x}u" for w in words]


def harness_data(program: CProgram, feeds: Mapping[str, np.ndarray]) -> str:
    """``harness_data.h``: the inputs as constants, the output buffers, and their tables."""
    in_t = "float" if all(t.dtype == np.float32 for t in program.inputs + program.outputs) else "void"
    marks = sum(1 for k in program.kernels if k.function) if program.options.profile else 0
    lines = ["/* Generated by opfuse: the test firmware's inputs and outputs. */",
             f"#define HARNESS_NUM_OUTPUTS {len(program.outputs)}",
             f"#define HARNESS_MARKS {marks}"]
    names = []
    for i, spec in enumerate(program.inputs):
        arr = np.ascontiguousarray(np.asarray(feeds[spec.name], dtype=spec.dtype).reshape(spec.shape))
        words = _words(arr.tobytes())
        body = ",\n".join(", ".join(words[k:k + 8]) for k in range(0, len(words), 8))
        lines.append(f"static const union {{ uint32_t w[{len(words)}]; {c_type(spec.dtype)} e[{max(arr.size, 1)}]; }} "
                     f"harness_in{i} = {{{{\n{body}\n}}}};")
        names.append(f"harness_in{i}.e")
    outs, words_per = [], []
    for j, spec in enumerate(program.outputs):
        n = max(int(np.prod(spec.shape)), 1)
        w = -(-n * spec.dtype.itemsize // 4)
        lines.append(f"static union {{ uint32_t w[{w}]; {c_type(spec.dtype)} e[{n}]; }} harness_out{j};")
        outs.append(f"harness_out{j}")
        words_per.append(str(w))
    tables = [(f"const {in_t} *const", "harness_inputs", names),
              (f"{in_t} *const", "harness_outputs", [o + ".e" for o in outs]),
              ("const uint32_t *const", "harness_output_data", [o + ".w" for o in outs]),
              ("const uint32_t", "harness_output_words", words_per)]
    for ctype, name, items in tables:
        lines.append(f"static {ctype} {name}[] = {{{', '.join(items) or '0'}}};")
    return "\n".join(lines) + "\n"


def _support_text(name: str) -> str:
    return resources.files("opfuse.runtime").joinpath("mcu_support", name).read_text()


@dataclass
class Firmware:
    elf: Path
    image: Sizes     # the whole firmware (harness, newlib, baked inputs, arena in .bss)
    library: Sizes   # model.c and model_weights.c alone
    build_seconds: float


def build_firmware(program: CProgram, feeds: Mapping[str, np.ndarray], workdir: Path) -> Firmware:
    """Cross-compile the library and the harness into ``workdir/firmware.elf``."""
    tools = find_tools()
    t0 = time.perf_counter()
    write_library(program, workdir)
    (workdir / "harness_data.h").write_text(harness_data(program, feeds))
    for name in SUPPORT_FILES:
        (workdir / name).write_text(_support_text(name))
    objs = []
    for name in (SOURCE_NAME, WEIGHTS_NAME, "harness.c", "startup.c"):
        obj = workdir / (Path(name).stem + ".o")
        _compile(tools, workdir / name, obj, workdir)
        objs.append(obj)
    elf = workdir / "firmware.elf"
    proc = _run([tools.gcc, *CPU_FLAGS, *LDFLAGS, "-T", str(workdir / "mps2_an500.ld"), *map(str, objs), "-lm",
                 "-o", str(elf)], COMPILE_TIMEOUT_S)
    if proc.returncode != 0:
        raise McuRunError(f"linking the firmware failed (exit {proc.returncode}):\n"
                          + "\n".join(proc.stderr.splitlines()[:40]))
    return Firmware(elf, sizes(tools, elf), sizes(tools, *objs[:2]), time.perf_counter() - t0)


@dataclass
class McuResult:
    """One run of the model on the emulated Cortex-M7."""

    outputs: dict[str, np.ndarray]
    instructions: int          # executed by opfuse_run (the call included)
    stack_bytes: int           # deepest stack below main's frame during opfuse_run (-1: beyond 64 KiB)
    firmware: Firmware
    arena_bytes: int
    run_seconds: float
    qemu_command: list[str] = field(default_factory=list)
    # Profile builds (``CodegenOptions(profile=True)``): group index -> instructions of its kernel
    # call, the marks' own cost taken off. The marks add to ``instructions``.
    kernel_instructions: dict[int, int] = field(default_factory=dict)

    def summary(self) -> dict:
        lib, img = self.firmware.library, self.firmware.image
        return {"instructions": self.instructions, "arena_bytes": self.arena_bytes,
                "stack_bytes": self.stack_bytes, "flash_bytes": lib.flash,
                "firmware_flash_bytes": img.flash, "firmware_sram_bytes": img.sram}


def instructions_from_ticks(fine: int, coarse: int, overhead: int, shift: int = ICOUNT_SHIFT) -> int:
    """Executed instructions between two timer reads: the fine timer's wraps come from the
    coarse one, then ``ticks * 40 ns / 2^shift``, less the reads' own instructions."""
    wraps = round((coarse * COARSE_PRESCALE - fine) / 2 ** 32)
    ticks = fine + wraps * 2 ** 32 - overhead
    return round(ticks * TIMER_NS_PER_TICK / 2 ** shift)


def qemu_command(tools: McuTools, elf: Path) -> list[str]:
    return [tools.qemu, "-M", QEMU_MACHINE, "-nographic", "-monitor", "none", "-serial", "none",
            "-semihosting-config", "enable=on,target=native", "-icount", f"shift={ICOUNT_SHIFT},align=off,sleep=off",
            "-kernel", str(elf)]


def parse_output(text: str, program: CProgram) -> tuple[dict[str, np.ndarray], int, int, int]:
    """(outputs, return code, instructions, stack bytes) from the harness's stdout."""
    head = re.search(rf"{_MARK} rc=(-?\d+) fine=(\d+) coarse=(\d+) overhead=(\d+) stack=(-?\d+)", text)
    if head is None or f"{_MARK} end" not in text:
        raise McuRunError("the firmware's output is incomplete:\n" + "\n".join(text.splitlines()[-20:]))
    rc, fine, coarse, overhead, stack = (int(x) for x in head.groups())
    outputs: dict[str, np.ndarray] = {}
    for j, spec in enumerate(program.outputs):
        m = re.search(rf"{_MARK} output {j} (\d+)\n", text)
        if m is None:
            raise McuRunError(f"the firmware printed no output {j}")
        n = int(m.group(1))
        words = text[m.end():].split()[:n]
        data = np.array([int(w, 16) for w in words], dtype="<u4").tobytes()
        count = int(np.prod(spec.shape))
        outputs[spec.name] = np.frombuffer(data[:count * spec.dtype.itemsize], dtype=spec.dtype).reshape(spec.shape)
    return outputs, rc, instructions_from_ticks(fine, coarse, overhead), stack


def kernel_instructions(text: str, shift: int = ICOUNT_SHIFT) -> dict[int, int]:
    """Per-kernel instruction counts from a profile build's marks (``opfuse-mcu: mark G T``).

    Two back-to-back marks (group -2) give a mark's own cost in ticks; each kernel's count is the
    ticks between the mark before it and its own, less that cost. Timer 0 counts down, modulo 2^32."""
    marks = [(int(g), int(t)) for g, t in re.findall(rf"{_MARK} mark (-?\d+) (\d+)", text)]
    if len(marks) < 3 or marks[0][0] != -2 or marks[1][0] != -2 or marks[2][0] != -1:
        raise McuRunError("the profile firmware printed no usable kernel marks")
    overhead = (marks[0][1] - marks[1][1]) % 2 ** 32
    out: dict[int, int] = {}
    for (_, before), (group, after) in zip(marks[2:], marks[3:], strict=False):
        ticks = (before - after) % 2 ** 32 - overhead
        out[group] = out.get(group, 0) + round(ticks * TIMER_NS_PER_TICK / 2 ** shift)
    return out


def run_firmware(program: CProgram, firmware: Firmware, timeout: float = RUN_TIMEOUT_S):
    tools = find_tools()
    cmd = qemu_command(tools, firmware.elf)
    t0 = time.perf_counter()
    proc = _run(cmd, timeout, cwd=firmware.elf.parent)
    seconds = time.perf_counter() - t0
    text = proc.stdout + proc.stderr
    if "opfuse-mcu: fault" in text:
        raise McuRunError("the model faulted on the emulated Cortex-M7")
    outputs, rc, instructions, stack = parse_output(text, program)
    if 1 <= rc <= len(program.faults):  # the harness exits non-zero then, having printed rc
        raise InputError(program.fault_message(rc))
    if rc != 0 or proc.returncode != 0:
        raise McuRunError(f"opfuse_run returned {rc}; qemu exited with {proc.returncode}")
    per_kernel = kernel_instructions(text) if program.options.profile else {}
    return McuResult(outputs, instructions, stack, firmware, program.arena_bytes, seconds, cmd, per_kernel)


def run_on_qemu(program: CProgram, feeds: Mapping[str, np.ndarray], workdir: str | Path | None = None,
                timeout: float = RUN_TIMEOUT_S) -> McuResult:
    """Build the firmware for ``program`` with ``feeds`` baked in and run it under QEMU."""
    if program.mcu is None:
        raise OpfuseError("this program was generated for the host; use generate_mcu")
    feeds = check_inputs(program.memory.graph, feeds)
    if workdir is not None:
        d = Path(workdir)
        d.mkdir(parents=True, exist_ok=True)
        return run_firmware(program, build_firmware(program, feeds, d), timeout)
    with tempfile.TemporaryDirectory(prefix="opfuse-mcu-") as tmp:
        return run_firmware(program, build_firmware(program, feeds, Path(tmp)), timeout)


class McuModel:
    """A model compiled for the Cortex-M7 (``opfuse.compile(model, target="cortex-m7")``): the
    standalone library, exportable as ``opfuse compile --target cortex-m7 -o DIR`` writes it, and
    runnable on the emulated core as ``opfuse run --backend cortex-m7`` runs it.

        m7 = opfuse.compile("zoo:resnet8", target="cortex-m7")
        m7.export_c("out/")                   # model.c, model.h, model_weights.c, README.md, report.json
        outputs = m7.run({"input": x})        # under QEMU (needs arm-none-eabi-gcc, newlib, qemu-system-arm)
        print(m7.instructions)                # executed by the last run (exact, -icount)

    Exporting needs no toolchain; running does, and says what to install in one line when it is missing.
    """

    def __init__(self, program: CProgram, graph: Graph, report: Mapping | None = None, compilation=None):
        if program.mcu is None:
            raise OpfuseError("this program was generated for the host; use generate_mcu")
        self.program = program
        self.graph = graph
        self.report = dict(report or {})
        self.compilation = compilation
        self.last_run: McuResult | None = None

    @property
    def arena_bytes(self) -> int:
        return self.program.arena_bytes

    @property
    def instructions(self) -> int | None:
        """Instructions ``opfuse_run`` executed in the last ``run`` (None before the first)."""
        return self.last_run.instructions if self.last_run is not None else None

    def run(self, feeds: Mapping[str, np.ndarray], *, cast: bool = False, workdir: str | Path | None = None,
            timeout: float = RUN_TIMEOUT_S) -> dict[str, np.ndarray]:
        """Build the firmware with ``feeds`` baked in and run it under QEMU; the outputs (the same bits
        as the host's portable build). The run's counts and sizes are kept in ``last_run``."""
        feeds = check_inputs(self.graph, feeds, cast=cast)
        find_tools()
        self.last_run = run_on_qemu(self.program, feeds, workdir, timeout)
        return self.last_run.outputs

    def export_c(self, directory: str | Path) -> list[Path]:
        """The library, its README and ``report.json``, as ``opfuse compile --target cortex-m7 -o DIR``."""
        return export_library(self.program, directory, self.report)
