"""Progress on stderr for the steps that take more than a moment (a C build, calibration,
measuring, interleaved runs, bisection), drawn with ``rich``.

Quiet unless stderr is a terminal, and always quiet after ``set_quiet(True)`` (``--quiet``), so
pipes, logs and ``--json`` output never see it. Steps nest: an inner step is one more line of
the display the outer step opened (``rich`` allows one live display at a time).

    with step("compiling C") as advance: ...                  # a spinner
    with step("timing runs", total=200) as advance:
        for _ in range(200): run(); advance()                 # a bar
    advance(completed=done, total=total)                      # or set both outright
"""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

_state: dict = {"quiet": False, "progress": None, "depth": 0}


def set_quiet(quiet: bool) -> None:
    _state["quiet"] = bool(quiet)


def enabled() -> bool:
    """Whether progress is drawn: not quiet, and stderr is a terminal."""
    isatty = getattr(sys.stderr, "isatty", None)
    return not _state["quiet"] and bool(isatty and isatty())


def _raw(stream):
    """The stream under the CLI's escaping wrapper (``report.terminal.SafeStream``): rich's own
    control sequences must reach the terminal as they are (descriptions are made printable here)."""
    return getattr(stream, "_stream", stream)


@contextlib.contextmanager
def step(description: str, total: int | None = None) -> Iterator[Callable[..., None]]:
    """A spinner (``total=None``) or a bar on stderr for the duration; yields
    ``advance(n=1, *, completed=None, total=None)``."""
    if not enabled():
        yield lambda n=1, **kw: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    outer = _state["progress"] is None
    if outer:
        _state["progress"] = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
                                      MofNCompleteColumn(), TimeElapsedColumn(),
                                      console=Console(file=_raw(sys.stderr), force_terminal=True), transient=True)
        _state["progress"].start()
    bar = _state["progress"]
    task = bar.add_task("".join(c if c.isprintable() else "?" for c in description), total=total)
    bar.refresh()  # shown at once, not at the next tick

    def advance(n: int = 1, *, completed: int | None = None, total: int | None = None) -> None:
        if completed is None:
            bar.advance(task, n)
        else:
            bar.update(task, completed=completed, total=total)

    try:
        yield advance
    finally:
        bar.remove_task(task)
        if outer:
            bar.stop()
            _state["progress"] = None
