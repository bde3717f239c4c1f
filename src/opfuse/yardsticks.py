"""The machine's yardsticks: what this machine does at its best with well-known code, so that a
measured rate reads against something (``opfuse compile --measure``, ``opfuse bench``).

* ``sgemm_gflops``: NumPy's float32 ``a @ b`` at n = 1024 (``2 n^3`` FLOPs) on one BLAS thread, best
  of ``SGEMM_REPEAT``: the single-core sgemm peak;
* ``copy_gbps``: ``np.copyto`` of 64 MiB, bytes read plus bytes written (STREAM's copy), best of
  ``COPY_REPEAT``.

The sgemm is the machine's, not the environment's: OpenBLAS reads ``BLAS_TUNING_ENVS`` once, when it
loads, to run another CPU's kernels (``OPENBLAS_CORETYPE``) or another cache's block sizes
(``OPENBLAS_L2_SIZE``, ``OPENBLAS_BLOCK_FACTOR``), and a process that has loaded it cannot undo them.
So the sgemm runs in a child process (this file run as a script: NumPy and nothing of opfuse) with
``OPENBLAS_NUM_THREADS=1`` and those variables removed, OpenBLAS choosing its kernels for this CPU.
Where the environment sets any of them, the figure they hold it to is timed too, in a second child
with them left as set, and both are reported (``sgemm_env_removed``, ``sgemm_gflops_as_set``): on a
Zen 5 host ``OPENBLAS_CORETYPE=Haswell`` (AVX2 kernels) held it to 106-116 GFLOP/s and
``OPENBLAS_L2_SIZE=512`` with its own SkylakeX kernels to 117-121, against 207 with neither.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Callable, Mapping

SGEMM_N = 1024
SGEMM_REPEAT = 5  # best of: a yardstick is what the machine can do, not what it did while busy
COPY_BYTES = 64 << 20  # well above the last-level cache
COPY_REPEAT = 5
BLAS_THREAD_ENVS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# Read by OpenBLAS when it loads (its library's getenv strings, 0.3.31): the kernels' CPU and the block sizes.
BLAS_TUNING_ENVS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_BLOCK_FACTOR")


def best_seconds(fn: Callable[[], object], repeat: int, warm: bool = True) -> float:
    """The shortest of ``repeat`` timed calls of ``fn`` (wall clock), after one untimed call with ``warm``
    (page faults, BLAS buffers)."""
    if warm:
        fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def sgemm_gflops(n: int = SGEMM_N, repeat: int = SGEMM_REPEAT) -> float:
    """GFLOP/s of NumPy's float32 ``a @ b`` at ``n x n`` (``2 n^3`` FLOPs), best of ``repeat``,
    with as many BLAS threads as the caller allows, in this process's BLAS as it was loaded."""
    import numpy as np
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    out = np.empty((n, n), np.float32)
    return 2 * n ** 3 / best_seconds(lambda: np.matmul(a, b, out=out), repeat) / 1e9


def blas_kernels() -> str | None:
    """The BLAS NumPy runs here and the CPU its kernels are for (``"openblas SkylakeX"``), from
    ``threadpoolctl``; ``None`` without it."""
    try:
        import numpy  # noqa: F401  (threadpoolctl sees only the libraries loaded)
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    for lib in threadpool_info():
        if lib.get("user_api") == "blas":
            return " ".join(str(lib[k]) for k in ("internal_api", "architecture") if lib.get(k))
    return None


def blas_tuning(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``BLAS_TUNING_ENVS`` that ``environ`` (default: this process's) sets, with their values."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in BLAS_TUNING_ENVS if k in environ}


def child_sgemm(n: int = SGEMM_N, *, keep_tuning: bool = False) -> tuple[float, str | None]:
    """``sgemm_gflops(n)`` and ``blas_kernels()`` in a child process on one BLAS thread, with the
    environment's ``BLAS_TUNING_ENVS`` removed (OpenBLAS choosing for this CPU) unless ``keep_tuning``."""
    env = {k: v for k, v in os.environ.items() if keep_tuning or k not in BLAS_TUNING_ENVS}
    env.update({k: "1" for k in BLAS_THREAD_ENVS})
    # -P: the script's folder (opfuse's, with its bisect.py) stays off sys.path, or it would shadow the standard library
    r = subprocess.run([sys.executable, "-P", os.path.abspath(__file__), str(n)], env=env, capture_output=True,
                       text=True, check=True)
    out = json.loads(r.stdout)
    return float(out["gflops"]), out["blas"]


def machine_sgemm(n: int = SGEMM_N) -> dict:
    """The one-core sgemm yardstick and where it comes from: ``sgemm_gflops`` (OpenBLAS's own
    choice, ``child_sgemm``), ``sgemm_n``, ``sgemm_blas`` (its kernels, ``None`` when unknown),
    ``sgemm_one_thread_by``, ``sgemm_env_removed`` (the tuning variables set here and removed for it,
    ``{}`` when none), and, when there were some, ``sgemm_gflops_as_set`` and ``sgemm_blas_as_set``:
    the same sgemm with them (``None`` otherwise)."""
    gflops, kernels = child_sgemm(n)
    removed = blas_tuning()
    held, held_kernels = child_sgemm(n, keep_tuning=True) if removed else (None, None)
    return {"sgemm_gflops": gflops, "sgemm_n": n, "sgemm_blas": kernels,
            "sgemm_one_thread_by": "OPENBLAS_NUM_THREADS=1 (child process)", "sgemm_env_removed": removed,
            "sgemm_gflops_as_set": held, "sgemm_blas_as_set": held_kernels}


def copy_gbps(nbytes: int = COPY_BYTES, repeat: int = COPY_REPEAT) -> float:
    """GB/s of ``np.copyto`` between two ``nbytes`` arrays, counting bytes read plus bytes written
    (STREAM's convention for its copy kernel), best of ``repeat``."""
    import numpy as np
    src = np.ones(nbytes // 4, np.float32)
    dst = np.zeros_like(src)
    return 2 * nbytes / best_seconds(lambda: np.copyto(dst, src), repeat) / 1e9


def yardsticks() -> dict:
    """This machine's yardsticks, timed now: ``machine_sgemm()``'s keys and ``copy_gbps``,
    ``copy_bytes``."""
    return {**machine_sgemm(), "copy_gbps": copy_gbps(), "copy_bytes": COPY_BYTES}


def sgemm_provenance(ys: Mapping) -> str:
    """Where the sgemm yardstick comes from, for a console line or a table's note: its kernels, and
    the tuning variables removed for it with the figure they hold it to (``""`` for a result from
    before this was recorded)."""
    if "sgemm_env_removed" not in ys:
        return ""
    kernels = f"{ys['sgemm_blas']} kernels" if ys.get("sgemm_blas") else "the BLAS's own kernels"
    removed = ys["sgemm_env_removed"]
    if not removed:
        return f"{kernels}, one thread in a child process"
    held = ys.get("sgemm_gflops_as_set")
    with_them = f" {held:.1f} GFLOP/s" if held is not None else ""
    held_kernels = f", {ys['sgemm_blas_as_set']} kernels" if ys.get("sgemm_blas_as_set") else ""
    return (f"{kernels}, one thread in a child process without {', '.join(f'{k}={v}' for k, v in removed.items())} "
            f"(set here; with them{with_them}{held_kernels})")


def describe(ys: Mapping, when: str = "timed now") -> str:
    """The console line: ``yardsticks (timed now): NumPy sgemm n=1024 one thread 207.1 GFLOP/s,
    np.copyto 30.2 GB/s (read + write)``, then the sgemm's provenance on the next line."""
    line = (f"yardsticks ({when}): NumPy sgemm n={ys['sgemm_n']} one thread {ys['sgemm_gflops']:.1f} GFLOP/s, "
            f"np.copyto {ys['copy_gbps']:.1f} GB/s (read + write)")
    how = sgemm_provenance(ys)
    return f"{line}\n  sgemm yardstick: {how}" if how else line


if __name__ == "__main__":  # child_sgemm: the sgemm alone, in a BLAS loaded with the environment given
    size = int(sys.argv[1]) if len(sys.argv) > 1 else SGEMM_N
    print(json.dumps({"gflops": sgemm_gflops(size), "blas": blas_kernels()}))
