"""Threads of the native runtime: how many by default, and how they wait between kernels.

``default_threads()`` is the number of cores this process may run on (``os.sched_getaffinity``,
so ``taskset`` and container CPU sets count), or ``OMP_NUM_THREADS`` when set to a positive
integer (the first entry of a nested list such as ``4,2``).

OpenMP threads that busy-wait between kernels steal the cores from everything else in the
process (and from other processes): on a loaded 2-core machine, 2 spinning threads made
ResNet-18 8x slower. Sleeping waits cost a few microseconds per parallel region instead. libgomp
reads ``OMP_WAIT_POLICY`` (and ``GOMP_SPINCOUNT``) once, when it is first loaded, and has no call
to change it later. ``passive_wait()`` therefore sets ``OMP_WAIT_POLICY=PASSIVE`` before the first
generated library loads it, unless the user set a policy; when another library (PyTorch,
scikit-learn, any ``-fopenmp`` extension) loaded the OpenMP runtime first, the setting comes too
late: its threads spin for ``GOMP_SPINCOUNT`` (300000 by default) iterations after every kernel.
Then it warns once; the cure is ``OMP_WAIT_POLICY=PASSIVE`` in the environment of the process.
"""
from __future__ import annotations

import os
import warnings

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
WAIT_POLICY_DEFAULT = "PASSIVE"
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
    """Ask for passive waits before the OpenMP runtime loads; returns the policy that holds:
    ``"PASSIVE"`` (set by opfuse), ``"user: <value>"`` (the environment's own setting), or
    ``"unknown: ..."`` (the runtime was loaded before opfuse could set it; warns once)."""
    global _wait_policy
    if _wait_policy is not None:
        return _wait_policy
    user = os.environ.get(WAIT_POLICY_ENV)
    if user is not None:
        _wait_policy = f"user: {user}"
    elif openmp_runtime_loaded():
        _wait_policy = ("unknown: the OpenMP runtime was loaded before opfuse, which could not set "
                        f"{WAIT_POLICY_ENV}={WAIT_POLICY_DEFAULT}")
        warnings.warn(f"opfuse: OpenMP was already loaded by another library, so its threads may busy-wait "
                      f"between kernels and steal cores; start the process with "
                      f"{WAIT_POLICY_ENV}={WAIT_POLICY_DEFAULT}", RuntimeWarning, stacklevel=3)
    else:
        os.environ[WAIT_POLICY_ENV] = WAIT_POLICY_DEFAULT
        _wait_policy = WAIT_POLICY_DEFAULT
    return _wait_policy


__all__ = ["default_threads", "passive_wait", "openmp_runtime_loaded", "WAIT_POLICY_DEFAULT"]
