"""Reproducers ``opfuse fuzz`` wrote (``tests/e2e/repro/<name>/``: model.onnx, inputs.npz, case.json),
replayed in a child process as ``opfuse fuzz --replay`` does. A failure whose fix belongs to code
another change is rewriting is an ``xfail`` naming why (``fuzz_cases.KNOWN_ISSUES``); once
fixed, the xfail turns into an unexpected pass (strict) and the entry goes."""
from __future__ import annotations

from pathlib import Path

import pytest

from opfuse.testing.fuzz import replay
from opfuse.testing.fuzz_cases import KNOWN_ISSUES

REPRO = Path(__file__).parent / "repro"
CASES = sorted(p.name for p in REPRO.iterdir() if (p / "model.onnx").is_file()) if REPRO.is_dir() else []


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN_ISSUES[n], strict=True))
                                  if n in KNOWN_ISSUES else n for n in CASES])
def test_reproducer_passes(name):
    verdict = replay(REPRO / name)
    assert not verdict.failed, verdict.line()


def test_every_known_issue_has_its_reproducer():
    assert sorted(KNOWN_ISSUES) == sorted(set(KNOWN_ISSUES) & set(CASES))
