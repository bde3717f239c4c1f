"""Threads of the native runtime: how many by default, and how they wait between kernels.

``default_threads()`` is the number of cores this process may run on (``os.sched_getaffinity``,
so ``taskset`` and container CPU sets count), or ``OMP_NUM_THREADS`` when set to a positive
integer (the first entry of a nested list such as ``4,2``).

OpenMP threads that busy-wait between kernels steal the cores from everything else in the
process (and from other processes): on a loaded 2-core machine, 2 threads spinning for libgomp's
default ``GOMP_SPINCOUNT`` (300000 iterations, milliseconds) made ResNet-18 8x slower. Waits that
sleep at once (``OMP_WAIT_POLICY=PASSIVE``) cost a futex wake-up per parallel region instead,
which on this VM made small models 2-5x slower on 2 threads than on 1 (ds_cnn 0.46 vs 0.09 ms,
mobilenet_v1_025_96 1.26 vs 0.30 ms). So opfuse bounds the spin: ``GOMP_SPINCOUNT=10000``
(``SPIN_COUNT_DEFAULT``), long enough for the next kernel's region to find the workers awake,
short enough that a worker spins about 0.1-0.2 ms after an inference's last kernel before it
sleeps (measured: 0.3 ms of CPU over both workers per resnet8 run while the caller sleeps,
against 0.08 ms passive and 3 ms at 100000). libgomp reads ``OMP_WAIT_POLICY`` and
``GOMP_SPINCOUNT`` once, when it is first loaded, and has no call to change them later.
``passive_wait()`` therefore sets ``GOMP_SPINCOUNT`` before the first generated library loads it,
unless the user set either variable; when another library (PyTorch, scikit-learn, any
``-fopenmp`` extension) loaded the OpenMP runtime first, the setting comes too late. Then it warns
once; the cure is ``GOMP_SPINCOUNT=10000`` (or ``OMP_WAIT_POLICY=PASSIVE``) in the environment
of the process.

On a machine whose cores other processes keep busy the bounded spin still costs: a region whose
worker is not scheduled waits out the master's whole spin (about 55 us per 1000 iterations on this
VM) before the master sleeps and frees the core. Measured with others taking ~1.5 of the 2 cores
(load average 7-8; ``benchmarks/omp_fork_join.c``, and whole runs 1 vs 2 threads): resnet8 0.2-0.4 ms
on 1 thread, 11-17 ms on 2 with ``GOMP_SPINCOUNT=10000`` (5 ms of CPU per run), 0.8 ms with 1000,
0.3-0.4 ms with ``OMP_WAIT_POLICY=PASSIVE``; ds_cnn 0.08-0.14 ms, 5-17, 0.6 and 0.16 ms. On such a
machine one thread is fastest; nothing here lowers the thread count by itself.
"""
from __future__ import annotations

import os
import warnings

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
WAIT_POLICY_DEFAULT = "PASSIVE"  # the cure the warning names, with the spin count below
SPIN_COUNT_ENV = "GOMP_SPINCOUNT"
SPIN_COUNT_DEFAULT = 10000  # iterations a libgomp worker spins before it sleeps (see above)
# Shared objects of the OpenMP runtimes a generated library may link against (GCC, LLVM, Intel).
OPENMP_RUNTIMES = ("libgomp", "libomp.so", "libiomp5")

_wait_policy: str | None = None  # what passive_wait() found the first time


def default_threads() -> int:
    """``OMP_NUM_THREADS`` when it is a positive integer, else the cores available to the process."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if first.isdigit() and int(first) > 0:
        return int(first)
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # no sched_getaffinity (macOS)
        return max(os.cpu_count() or 1, 1)


def openmp_runtime_loaded() -> bool | None:
    """Whether an OpenMP runtime is mapped into this process; ``None`` where it cannot be told."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return None
    return any(name in maps for name in OPENMP_RUNTIMES)


def passive_wait() -> str:
    """Bound the OpenMP workers' spin before the runtime loads; returns the policy that holds:
    ``"GOMP_SPINCOUNT=10000"`` (set by opfuse), ``"user: <variable>=<value>"`` (the environment's
    own setting), or ``"unknown: ..."`` (the runtime was loaded before opfuse could set it; warns once)."""
    global _wait_policy
    if _wait_policy is not None:
        return _wait_policy
    user = next(((k, os.environ[k]) for k in (WAIT_POLICY_ENV, SPIN_COUNT_ENV) if k in os.environ), None)
    if user is not None:
        _wait_policy = f"user: {user[0]}={user[1]}"
    elif openmp_runtime_loaded():
        _wait_policy = ("unknown: the OpenMP runtime was loaded before opfuse, which could not set "
                        f"{SPIN_COUNT_ENV}={SPIN_COUNT_DEFAULT}")
        warnings.warn(f"opfuse: OpenMP was already loaded by another library, so its threads may busy-wait "
                      f"between kernels and steal cores; start the process with "
                      f"{SPIN_COUNT_ENV}={SPIN_COUNT_DEFAULT} or {WAIT_POLICY_ENV}={WAIT_POLICY_DEFAULT}",
                      RuntimeWarning, stacklevel=3)
    else:
        os.environ[SPIN_COUNT_ENV] = str(SPIN_COUNT_DEFAULT)
        _wait_policy = f"{SPIN_COUNT_ENV}={SPIN_COUNT_DEFAULT}"
    return _wait_policy


__all__ = ["default_threads", "passive_wait", "openmp_runtime_loaded", "WAIT_POLICY_DEFAULT", "SPIN_COUNT_DEFAULT"]
