"""tools/mutate_narrow.py without mutmut: a hand-made ``mutants/`` tree whose functions read ``MUTANT_UNDER_TEST``
as mutmut's trampolines do. A mutant of code run while its module is imported cannot die in a fork (the tests
were collected, so the module imported, before it); ``--fresh`` runs each mutant in a new interpreter, where it
does."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "mutate_narrow.py"

MODULE = """
import os


def _which():
    which = os.environ.get("MUTANT_UNDER_TEST", "")
    if which == "fail":  # mutmut's forced failure: the tool's sanity run
        raise RuntimeError("forced failure")
    return which


def _table():
    return 3 if _which() == "mqpkg.x__table__mutmut_1" else 2


TABLE = _table()  # computed once, when the module is imported


def twice(x):
    return x * 3 if _which() == "mqpkg.x_twice__mutmut_1" else x * 2
"""

TESTS = """
from mqpkg import TABLE, twice


def test_table():
    assert TABLE == 2


def test_twice():
    assert twice(2) == 4
"""


def _run(root: Path, *extra: str) -> dict[str, str]:
    proc = subprocess.run([sys.executable, str(TOOL), "--tests", "tests/test_mq.py", *extra, "--", "mqpkg.*"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return dict(line.split()[:2] for line in proc.stdout.splitlines() if line.startswith("mqpkg."))


def test_fresh_runs_import_time_mutants(tmp_path):
    pkg = tmp_path / "mutants" / "src" / "mqpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(MODULE))
    names = ["mqpkg.x__table__mutmut_1", "mqpkg.x_twice__mutmut_1", "mqpkg.x_twice__mutmut_2"]  # 2: no change
    (pkg / "__init__.py.meta").write_text(json.dumps({"exit_code_by_key": dict.fromkeys(names)}))
    (tmp_path / "mutants" / "tests").mkdir()
    (tmp_path / "mutants" / "tests" / "test_mq.py").write_text(textwrap.dedent(TESTS))
    forked = _run(tmp_path)
    # in a fork the import-time mutant never ran: it shows as a survivor (why --fresh exists)
    assert forked == {"mqpkg.x__table__mutmut_1": "survived", "mqpkg.x_twice__mutmut_1": "killed",
                      "mqpkg.x_twice__mutmut_2": "survived"}
    assert _run(tmp_path, "--fresh") == {**dict.fromkeys(names[:2], "killed"), "mqpkg.x_twice__mutmut_2": "survived"}
