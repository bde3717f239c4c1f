"""Progress bars: drawn only on a terminal, never with --quiet, and steps nest (one display)."""
import io

from opfuse import progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_nested_steps_share_one_display_on_a_terminal(monkeypatch):
    monkeypatch.setattr("sys.stderr", FakeTerminal())  # in the test body: pytest resets sys.stderr after setup
    progress.set_quiet(False)
    assert progress.enabled()
    with progress.step("outer", total=3) as advance:
        display = progress._state["progress"]
        assert display is not None
        with progress.step("compiling C"):  # rich allows one live display: the inner step joins it
            assert progress._state["progress"] is display and len(display.tasks) == 2
        advance()
        advance(completed=3, total=3)
    assert progress._state["progress"] is None


def test_quiet_and_pipes_draw_nothing(monkeypatch):
    term = FakeTerminal()
    monkeypatch.setattr("sys.stderr", term)
    progress.set_quiet(True)
    try:
        with progress.step("hidden", total=2) as advance:
            advance()
    finally:
        progress.set_quiet(False)
    assert term.getvalue() == ""
    pipe = io.StringIO()
    monkeypatch.setattr("sys.stderr", pipe)
    with progress.step("hidden too"):
        pass
    assert pipe.getvalue() == ""
