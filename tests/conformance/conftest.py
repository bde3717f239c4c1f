"""Print the ONNX node conformance count at the end of the session."""
from __future__ import annotations

from collections import Counter

NODE_TEST_PREFIX = "test_onnx_node.py::test_node["
_outcomes: Counter = Counter()


def pytest_runtest_logreport(report):
    if NODE_TEST_PREFIX not in report.nodeid:
        return
    if report.when == "call":
        _outcomes[report.outcome] += 1
    elif report.when == "setup" and report.skipped:
        _outcomes["excluded"] += 1
    elif report.when == "setup" and report.failed:
        _outcomes["failed"] += 1


def pytest_terminal_summary(terminalreporter):
    if not _outcomes:
        return
    line = f"ONNX node conformance: {_outcomes['passed']} passed, {_outcomes['excluded']} excluded"
    if _outcomes["failed"]:
        line += f", {_outcomes['failed']} FAILED"
    terminalreporter.write_sep("-", line)
