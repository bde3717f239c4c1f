"""``HardwareProfile``: the handful of numbers the cost model needs about a target.

The roofline of a target is two numbers, the peak arithmetic throughput ``P_peak``
(FLOP/s, per dtype) and the main-memory bandwidth ``B`` (bytes/s); their ratio
``I_c = P_peak / B`` is the ridge point: a kernel whose operational intensity
``I = FLOPs / bytes`` is below ``I_c`` is bandwidth-bound, above it compute-bound.
Around the roofline sit the quantities that decide whether a fusion is *worth it*:

* ``onchip_bytes``: cache or SRAM that a fused kernel's buffered intermediates must fit
  in (over-fusion beyond it spills back to main memory);
* ``register_bytes`` / ``vector_bytes``: the vector register file, so
  ``register_bytes // vector_bytes`` values can stream through registers at once;
* ``launch_overhead_s``: fixed cost per kernel (call or launch), saved by every fusion;
* NUMA nodes with local and remote memory latency, a cache-line size and the number of
  cache-line misses a core keeps in flight (memory-level parallelism).

Profiles are plain data: they round-trip through JSON (``to_dict``/``from_dict``,
``save_profile``/``load_profile``) and print as a small table (``format_profile``).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from opfuse.errors import OpfuseError
from opfuse.targets.cache import atomic_write_json

PROFILE_FORMAT_VERSION = 1
# An instruction-count model (``HardwareProfile.instruction_costs``, fitted for the Cortex-M7 from
# QEMU counts): instructions per FLOP of each op class, per boundary byte moved, per kernel call.
OP_CLASSES = ("conv", "depthwise", "gemm", "pool", "elementwise")
INSTRUCTION_COST_KEYS = (*OP_CLASSES, "byte", "call")
_DTYPE_KEYS: dict = {}  # dtype spelling -> NumPy name, memoised (np.dtype(...).name is slow)


class ProfileError(OpfuseError):
    """An unknown target name or a malformed profile file."""


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    peak_flops: dict[str, float]  # dtype name (NumPy spelling) -> FLOP/s
    mem_bandwidth: float  # bytes/s, main memory (DRAM/HBM), read + write counted together
    onchip_bytes: int  # cache or SRAM a fused group's buffers must fit in
    register_bytes: int  # vector register file (per thread on GPUs)
    vector_bytes: int  # width of one vector register / access
    launch_overhead_s: float  # per kernel call or launch
    numa_nodes: int = 1
    numa_local_latency_s: float = 1e-7
    numa_remote_latency_s: float = 1e-7
    cache_line_bytes: int = 64
    memory_parallelism: int = 1  # cache-line misses in flight per core
    calibrated: bool = False
    source: str = "datasheet"  # where the numbers come from (datasheet, gcc calibration, file)
    notes: tuple[str, ...] = field(default_factory=tuple)  # assumptions, one line each
    # In-order core without a cache to plan for (the Cortex-M7): time = instructions / clock_hz with
    # instructions = sum_class cost[class] * FLOPs + cost["byte"] * boundary bytes + cost["call"],
    # fitted from emulated counts; empty: the roofline of the peaks and the bandwidth above.
    instruction_costs: dict[str, float] = field(default_factory=dict)
    clock_hz: float = 0.0

    def __post_init__(self):
        problems = []
        if not self.peak_flops:
            problems.append("peak_flops is empty")
        for k, v in self.peak_flops.items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                problems.append(f"peak_flops[{k!r}] = {v!r} is not a positive number")
        for name in ("mem_bandwidth", "launch_overhead_s", "numa_local_latency_s",
                     "numa_remote_latency_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                problems.append(f"{name} = {v!r} is not a non-negative number")
        if not self.mem_bandwidth > 0:
            problems.append("mem_bandwidth must be positive")
        for name in ("onchip_bytes", "register_bytes", "vector_bytes", "numa_nodes",
                     "cache_line_bytes", "memory_parallelism"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v > 0):
                problems.append(f"{name} = {v!r} is not a positive integer")
        if self.numa_remote_latency_s < self.numa_local_latency_s:
            problems.append("numa_remote_latency_s is below numa_local_latency_s")
        if not isinstance(self.instruction_costs, dict):
            problems.append("instruction_costs must be an object of name -> instructions")
        else:
            for k, v in self.instruction_costs.items():
                if k not in INSTRUCTION_COST_KEYS:
                    problems.append(f"instruction_costs[{k!r}]: expected one of {', '.join(INSTRUCTION_COST_KEYS)}")
                elif not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                    problems.append(f"instruction_costs[{k!r}] = {v!r} is not a non-negative number")
            if self.instruction_costs and not (isinstance(self.clock_hz, (int, float)) and self.clock_hz > 0):
                problems.append("instruction_costs need a positive clock_hz")
        if problems:
            raise ProfileError(f"profile '{self.name}': " + "; ".join(problems))
        object.__setattr__(self, "instruction_costs", {str(k): float(v) for k, v in self.instruction_costs.items()})
        object.__setattr__(self, "peak_flops", {str(k): float(v) for k, v in self.peak_flops.items()})
        object.__setattr__(self, "notes", tuple(self.notes))

    # Roofline -------------------------------------------------------------------------
    def peak_for(self, dtype) -> float:
        """Peak FLOP/s for arithmetic in ``dtype``.

        A dtype the profile does not list gets the *lowest* listed peak: an unknown
        dtype is assumed to run on the slowest unit rather than the fastest.
        """
        key = self._dtype_key(dtype)
        if key in self.peak_flops:
            return self.peak_flops[key]
        return min(self.peak_flops.values())

    @staticmethod
    def _dtype_key(dtype) -> str:
        key = _DTYPE_KEYS.get(dtype)
        if key is None:
            if dtype is None:
                key = "float32"
            else:
                try:
                    key = np.dtype(dtype).name
                except TypeError:  # names NumPy lacks (bfloat16, float8) are kept as given
                    key = str(dtype)
            _DTYPE_KEYS[dtype] = key
        return key

    def ridge_point(self, dtype="float32") -> float:
        """``I_c = P_peak / B`` in FLOP/byte."""
        return self.peak_for(dtype) / self.mem_bandwidth

    @property
    def vector_registers(self) -> int:
        return max(1, self.register_bytes // self.vector_bytes)

    def with_overrides(self, **changes) -> "HardwareProfile":
        """A copy with some fields replaced (e.g. a what-if bandwidth)."""
        return replace(self, **changes)

    # Serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        if not self.instruction_costs:  # roofline profiles keep their serialised form (and digest)
            del d["instruction_costs"], d["clock_hz"]
        d["format_version"] = PROFILE_FORMAT_VERSION
        return d

    @classmethod
    def from_dict(cls, data: dict, where: str = "profile") -> "HardwareProfile":
        if not isinstance(data, dict):
            raise ProfileError(f"{where}: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        required = {"name", "peak_flops", "mem_bandwidth", "onchip_bytes", "register_bytes",
                    "vector_bytes", "launch_overhead_s"}
        missing = sorted(required - set(data))
        if missing:
            raise ProfileError(f"{where}: missing field(s) {missing}")
        unknown = sorted(set(data) - known - {"format_version"})
        if unknown:
            raise ProfileError(f"{where}: unknown field(s) {unknown}")
        kwargs = {k: v for k, v in data.items() if k in known}
        if not isinstance(kwargs["peak_flops"], dict):
            raise ProfileError(f"{where}: peak_flops must be an object of dtype -> FLOP/s")
        kwargs["notes"] = tuple(kwargs.get("notes", ()))
        try:
            return cls(**kwargs)
        except TypeError as e:
            raise ProfileError(f"{where}: {e}") from None


def save_profile(profile: HardwareProfile, path: str | Path) -> Path:
    """Write ``profile`` as JSON (atomically: a reader never sees half a file)."""
    path = Path(path)
    atomic_write_json(path, profile.to_dict(), private=False)
    return path


def load_profile(path: str | Path) -> HardwareProfile:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"profile file '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProfileError(f"profile file '{path}' is not valid JSON: {e}") from None
    return HardwareProfile.from_dict(data, where=f"profile file '{path}'")


# Text form ------------------------------------------------------------------------------

def _si(x: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _bytes(n: int) -> str:
    for scale, prefix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale:
            return f"{n / scale:.4g} {prefix}"
    return f"{n} B"


def _seconds(s: float) -> str:
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s:.3g} s"


def format_profile(profile: HardwareProfile) -> str:
    """A human-readable table of the profile, one quantity per line."""
    p = profile
    rows = [("target", p.name),
            ("source", p.source + (" (calibrated)" if p.calibrated else ""))]
    for dtype in sorted(p.peak_flops):
        rows.append((f"peak {dtype}", f"{_si(p.peak_flops[dtype], 'FLOP/s')}   "
                                      f"ridge I_c = {p.ridge_point(dtype):.3g} FLOP/B"))
    rows += [("memory bandwidth", _si(p.mem_bandwidth, "B/s")),
             ("on-chip capacity", _bytes(p.onchip_bytes)),
             ("registers", f"{_bytes(p.register_bytes)} ({p.vector_registers} x {p.vector_bytes} B vectors)"),
             ("kernel overhead", _seconds(p.launch_overhead_s)),
             ("NUMA nodes", f"{p.numa_nodes} (local {_seconds(p.numa_local_latency_s)}, "
                            f"remote {_seconds(p.numa_remote_latency_s)})"),
             ("cache line", f"{p.cache_line_bytes} B, {p.memory_parallelism} misses in flight")]
    if p.instruction_costs:
        rows.append(("clock", _si(p.clock_hz, "Hz")))
        rows += [(f"instructions/{'FLOP ' + k if k not in ('byte', 'call') else k}", f"{v:.4g}")
                 for k, v in p.instruction_costs.items()]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)
