"""tools/mutate_quick.py without mutmut: how it runs test functions (fixtures from the file and the
conftest.py files above it, built-in fixtures, marks) and how it sees whether a process compiled C
(opfuse's build cache is content-addressed, so an unchanged program is a hit and costs no compile)."""
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import mutate_quick as mq  # noqa: E402

from opfuse.ir import Graph  # noqa: E402
from opfuse.ops import GraphBuilder  # noqa: E402


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_fixtures_marks_and_skips(tmp_path):
    root = tmp_path / "tests"
    _write(root / "conftest.py", """
        import pytest
        CALLS = []

        @pytest.fixture(scope="session")
        def outer(tmp_path_factory):
            CALLS.append("outer")
            return tmp_path_factory.mktemp("outer")

        @pytest.fixture(params=[1, 2])
        def param_fixture():
            return 0
        """)
    test = _write(root / "sub" / "test_mq_sample_a.py", """
        import pytest

        @pytest.fixture
        def inner(outer, tmp_path):
            yield (outer, tmp_path)
            inner.torn_down = True

        def test_uses(inner, cache_dir, monkeypatch, worker_id):
            monkeypatch.setenv("MQ_SAMPLE", "1")
            assert inner[0].is_dir() and inner[1].is_dir() and inner[0] != inner[1]
            assert worker_id == "master"
            assert cache_dir.name == "the-cache"

        @pytest.mark.parametrize("a, b", [(1, 2), pytest.param(3, 4, marks=pytest.mark.slow)])
        def test_param(a, b):
            assert b == a + 1

        @pytest.mark.skipif(True, reason="never")
        def test_skipped():
            raise AssertionError

        def test_skips_itself():
            pytest.skip("at run time")

        def test_needs_param(param_fixture):
            pass

        def test_needs_request(request):
            pass
        """)
    tests, skipped = mq.collect([str(test)])
    ids = [t.id.split("::")[1] for t in tests]
    assert ids == ["test_uses", "test_param[0]", "test_skips_itself"]
    assert sorted(s.split("::")[1] for s in skipped) == [
        "test_needs_param (needs a fixture)", "test_needs_request (needs a fixture)",
        "test_param[1] (marked)", "test_skipped (marked)"]
    session = mq._Session(tmp_path / "the-cache")
    try:
        for t in tests:
            session.call(t)  # pytest.skip() inside a test is a pass, not a failure
        session.call(tests[0])
        conftest = sys.modules[next(n for n, m in sys.modules.items()
                                    if n.startswith("conftest_") and hasattr(m, "CALLS"))]
        assert conftest.CALLS == ["outer"]  # session scope: made once for both calls
        import os
        assert "MQ_SAMPLE" not in os.environ  # monkeypatch undone after the test
    finally:
        session.close()
    assert not session.base.exists()
    bad = next(t for t in tests if t.id.endswith("test_param[0]"))
    wrong = mq.Test(bad.id, bad.fn, {"a": 1, "b": 5}, bad.fixtures, bad.autouse)
    with pytest.raises(AssertionError):
        mq._Session(tmp_path / "the-cache").call(wrong)


def _graph(op: str) -> Graph:
    b = GraphBuilder("mq")
    return b.build(b.op(op, b.input("x", (4,))))


def test_build_log_sees_compiles_and_unchanged_c(tmp_path, monkeypatch):
    from opfuse.runtime import toolchain
    from opfuse.runtime.native import build
    monkeypatch.setattr(toolchain, "build_key", toolchain.build_key)  # BuildLog.install replaces both
    monkeypatch.setattr(toolchain, "_build_entry", toolchain._build_entry)
    log = mq.BuildLog()
    log.install()
    cache = tmp_path / "cache"
    x = np.array([-1, 0, 1, 2], dtype=np.float32)
    g = _graph("Relu")
    assert np.array_equal(build(g, cache_dir=cache).run({"x": x})[g.outputs[0].name], [0, 0, 1, 2])
    assert (len(set(log.keys)), log.compiled) == (1, 1)
    build(_graph("Relu"), cache_dir=cache)  # the same C again: a cache hit
    assert (len(set(log.keys)), log.compiled) == (1, 1)
    baseline = set(log.keys)
    build(_graph("Neg"), cache_dir=cache)  # another op: other C
    assert (len(set(log.keys)), log.compiled) == (2, 2)
    log.dump(tmp_path / "log.json")
    import json
    data = json.loads((tmp_path / "log.json").read_text())
    assert mq.classify("survived", data, baseline) == "survived (C changed)"
    assert mq.classify("survived", {"keys": sorted(baseline), "compiled": 0}, baseline) == "survived (C unchanged)"
    assert mq.classify("killed", data, baseline) == "killed"
    assert mq.classify("survived", {"keys": [], "compiled": 0}, set()) == "survived"  # no C built either way


def test_sample_is_a_stable_fraction_drawn_by_name():
    names = [f"opfuse.codegen.conv.x_f{i % 7}__mutmut_{i}" for i in range(4000)]
    picked = [n for n in names if mq.in_sample(n, 0.1, "0")]
    assert 300 < len(picked) < 500  # about a tenth
    assert picked == [n for n in reversed(names) if mq.in_sample(n, 0.1, "0")][::-1]  # order does not matter
    assert set(picked) != {n for n in names if mq.in_sample(n, 0.1, "1")}  # another seed, another draw
    assert all(mq.in_sample(n, 1.0, "0") for n in names[:50])
    assert set(picked) <= {n for n in names if mq.in_sample(n, 0.2, "0")}  # a larger fraction contains it


@pytest.mark.parametrize("fresh", [False, True])
def test_reach_with_fresh_fixtures_counts_a_module_fixture_for_every_test(tmp_path, fresh):
    """A module fixture whose work reaches a function (here on its first use, as test_ops.py's suites) counts
    for the first test alone, unless ``fresh`` makes it again for each test."""
    pytest.importorskip("mutmut.mutation.trampoline")
    test = _write(tmp_path / "tests" / f"test_mq_reach_{int(fresh)}.py", """
        import pytest

        @pytest.fixture(scope="module")
        def built():
            done = {}

            def get():
                if not done:
                    from mutmut.mutation import trampoline
                    trampoline.record_trampoline_hit("m.x_built")
                    done["model"] = 1
                return done["model"]
            return get

        def test_first(built):
            assert built() == 1

        def test_second(built):
            assert built() == 1

        def test_other():
            pass
        """)
    tests, _ = mq.collect([str(test)])
    hits, _, cost, compiled = mq.reach(tests, tmp_path / "cache", fresh=fresh)
    first, second = (f"{test}::test_{n}" for n in ("first", "second"))
    assert hits == {"m.x_built": [first, second] if fresh else [first]}
    assert len(cost) == 3 and compiled == 0


def test_a_kill_records_the_failing_test_and_its_exception(tmp_path):
    """The log of a killed mutant names the test that failed and the exception's first line (``--`` output:
    ``killed # ..., by TEST: Type: message``), so a kill that is not a real failure can be told apart."""
    test = _write(tmp_path / "tests" / "test_mq_kill.py", """
        def test_passes():
            assert 1 + 1 == 2

        def test_fails():
            assert [1, 2] == [1, 3], "the second element differs"

        def test_never_run():
            raise RuntimeError("after the first failure nothing else runs")
        """)
    tests, _ = mq.collect([str(test)])
    log_to = tmp_path / "log.json"
    assert mq._run_tests(tests, tmp_path / "cache", log_to) == 1
    import json
    failure = json.loads(log_to.read_text())["failure"]
    assert failure == f"{test}::test_fails: AssertionError: the second element differs", failure
    assert mq._run_tests([t for t in tests if t.id.endswith("test_passes")], tmp_path / "cache", log_to) == 0
    assert json.loads(log_to.read_text())["failure"] is None
