"""Threads of the native runtime: how many by default, and how they wait between kernels.

``default_threads()`` is the number of cores this process may run on (``os.sched_getaffinity``,
so ``taskset`` and container CPU sets count), or ``OMP_NUM_THREADS`` when set to a positive
integer (the first entry of a nested list such as ``4,2``), the variable every threaded numeric
library reads.

The generated program runs its parallel loops on its own pool of POSIX threads
(``opfuse.codegen.threadpool``), not on OpenMP. The caller of a loop takes its share like the
workers do and, at the loop's end, waits only for pieces a worker has started: a worker that the
scheduler has not run yet costs nothing, so a busy machine makes a model as slow as one thread at
worst. With libgomp every region waited for every worker (on this 2-core VM with one busy process on
the other core, at 2 threads: resnet8 0.114 -> 0.828 ms, the PP-OCR classifier 0.50 -> 25-44 ms).
An idle worker spins ``SPIN_NS`` (100 us: the next kernel's loop finds it awake) and then sleeps; no
environment variable is needed or read for it, and other libraries' OpenMP runtimes are not touched.
"""
from __future__ import annotations

import os

from opfuse.codegen.threadpool import SPIN_NS

POOL_DESCRIPTION = f"opfuse pool: the caller takes pieces too, workers spin {SPIN_NS // 1000} us then sleep"


def default_threads() -> int:
    """``OMP_NUM_THREADS`` when it is a positive integer, else the cores available to the process."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if first.isdigit() and int(first) > 0:
        return int(first)
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # no sched_getaffinity (macOS)
        return max(os.cpu_count() or 1, 1)


__all__ = ["default_threads", "POOL_DESCRIPTION"]
