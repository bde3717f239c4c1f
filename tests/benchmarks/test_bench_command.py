"""``opfuse bench``: the smoke run on resnet8 (keys, ratios consistent with medians), one line and
exit 2 on bad input, a missing peer skipped in one line, and the rest of the API it rests on."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from opfuse.bench import FUSED, UNFUSED, cross_check, parse_peers, time_interleaved, Contender
from opfuse.cli import main
from opfuse.errors import OpfuseError

ROW_KEYS = {"median_ms", "p90_ms", "min_ms", "runs", "cpu_median_ms", "max_abs_error"}


def test_bench_resnet8_json_smoke():
    r = subprocess.run([sys.executable, "-m", "opfuse.cli", "bench", "zoo:resnet8", "--repeat", "3", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout)
    for key in ("model", "threads", "repeat", "warmup", "contenders", "best_peer", "ratios", "errors", "skipped",
                "yardsticks", "order", "other_processes_cores"):
        assert key in res, key
    rows = res["contenders"]
    assert {FUSED, UNFUSED} <= rows.keys() and res["order"][:2] == [FUSED, UNFUSED]
    for name, row in rows.items():
        assert ROW_KEYS <= row.keys(), name
        assert row["runs"] == 3 and 0 < row["min_ms"] <= row["median_ms"] <= row["p90_ms"]
    assert rows[FUSED]["kernels"] < rows[UNFUSED]["kernels"]
    assert res["errors"]["outputs_agree"]
    assert res["yardsticks"]["sgemm_gflops"] > 0 and res["yardsticks"]["copy_gbps"] > 0
    peers = [p for p in ("onnxruntime", "openvino") if p in rows]
    assert set(peers) | set(res["skipped"]) == {"onnxruntime", "openvino"}
    if peers:
        best = res["best_peer"]
        assert rows[best]["median_ms"] == min(rows[p]["median_ms"] for p in peers)
        for name, row in rows.items():
            assert res["ratios"][name] == pytest.approx(row["median_ms"] / rows[best]["median_ms"])
        assert res["ratios"][best] == 1.0
    for line in r.stderr.splitlines():  # a skipped peer says so in one line
        assert line.startswith("opfuse bench: skipped ")


@pytest.mark.parametrize("argv, words", [
    (["zoo:no_such_model"], "unknown zoo model"),
    (["missing.onnx"], "not found"),
    (["zoo:resnet8", "--vs", "onnxruntime,tvm"], "unknown peer 'tvm'"),
    (["zoo:resnet8", "--repeat", "0"], "repeat must be"),
    (["zoo:resnet8", "--threads", "0"], "threads must be"),
    (["zoo:resnet8", "--groups", "--group-repeat", "0"], "group repeat must be"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, words):
    code = main(["bench", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and words in err and err.startswith("opfuse: error:")


def test_a_missing_peer_is_skipped_in_one_line(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
    code = main(["bench", "zoo:ds_cnn", "--vs", "openvino", "--repeat", "1", "--warmup", "0", "--threads", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err.strip() == "opfuse bench: skipped openvino: openvino is not installed (pip install 'opfuse[bench]')"
    assert "opfuse fused" in out and "yardsticks" in out


def test_parse_peers():
    assert parse_peers("onnxruntime, openvino,onnxruntime") == ("onnxruntime", "openvino")
    assert parse_peers("none") == parse_peers("") == ()
    with pytest.raises(OpfuseError, match="unknown peer"):
        parse_peers(["ort"])


def test_calls_are_interleaved_after_warmup():
    calls: list[str] = []
    cs = [Contender(n, (lambda n=n: calls.append(n) or {})) for n in "ABC"]
    samples = time_interleaved(cs, repeat=2, warmup=1)
    assert "".join(calls) == "ABC" "BCA" "CAB"  # each round one later: each follows each other alike
    assert {k: len(v) for k, v in samples.items()} == {"A": 2, "B": 2, "C": 2}


def test_cpu_time_counts_work_not_waiting():
    def spin():
        t = time.perf_counter()
        while time.perf_counter() - t < 0.02:
            pass
        return {}
    cs = [Contender("sleep", lambda: time.sleep(0.02) or {}), Contender("spin", spin)]
    cpu: dict = {}
    wall = time_interleaved(cs, repeat=3, warmup=0, cpu=cpu)
    assert min(wall["sleep"]) >= 0.02 and max(cpu["sleep"]) < 0.01  # sleeping takes time, not CPU
    assert len(cpu["spin"]) == 3 and sum(cpu["spin"]) > 0


def test_a_fast_wrong_answer_shows():
    right = {"y": np.array([1.0, 2.0, 3.0], np.float32)}
    wrong = {"y": np.array([1.0, 2.0, 4.0], np.float32)}
    res = cross_check({"a": right, "b": dict(right), "fast": wrong})
    assert not res["outputs_agree"]
    assert res["nearest"] == {"a": 0.0, "b": 0.0, "fast": 1.0}
    assert res["pairs"]["a vs fast"] == 1.0


def _fake_result(model: str, threads: int, ms: dict[str, float]) -> dict:
    best = min(("onnxruntime", "openvino"), key=lambda p: ms[p])
    return {"model": f"zoo:{model}", "graph": model, "threads": threads, "repeat": 2, "warmup": 1, "cpus_available": 2,
            "contenders": {k: {"median_ms": v, "version": "x"} for k, v in ms.items()}, "best_peer": best,
            "ratios": {k: v / ms[best] for k, v in ms.items()}, "skipped": {}, "errors": {"outputs_agree": True},
            "yardsticks": {"sgemm_gflops": 90.0, "copy_gbps": 20.0}, "other_processes_cores": 0.5}


def test_make_bench_table_has_a_row_per_run_and_a_geometric_mean(tmp_path):
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_zoo.py"
    runs = {("a", 1): (2.0, 4.0, 1.0, 2.0), ("b", 1): (8.0, 9.0, 4.0, 2.0), ("a", 2): (1.0, 2.0, 1.0, 1.0),
            ("b", 2): (4.0, 5.0, 2.0, 2.0)}
    for (m, t), ms in runs.items():
        res = _fake_result(m, t, dict(zip(("opfuse_fused", "opfuse_unfused", "onnxruntime", "openvino"), ms,
                                          strict=True)))
        (tmp_path / f"bench_{m}_t{t}.json").write_text(json.dumps(res))
    r = subprocess.run([sys.executable, str(script), "a", "b", "--results", str(tmp_path), "--table-only"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "bench.md").read_text()
    assert "| a | 1 | 2.000 | 4.000 | 1.000 | 2.000 | 2.00 | 0.50 |" in md
    assert "| b | 2 | 4.000 | 5.000 | 2.000 | 2.000 | 2.00 | 0.50 |" in md
    assert "| **geometric mean** | 1 | 4.000 | 6.000 | 2.000 | 2.000 | **2.83** | |" in md  # sqrt(2 * 4)
    assert "| a | 2.00x | 2.00x | 1.00x | 2.00x |" in md  # 1 thread over 2 threads
    assert "Per-group check" not in md  # no run had one


def test_make_bench_lists_the_groups_fusion_made_slower(tmp_path):
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_zoo.py"
    res = _fake_result("a", 1, {"opfuse_fused": 1.0, "opfuse_unfused": 2.0, "onnxruntime": 1.0, "openvino": 2.0})
    res["group_check"] = {"fused_s": 3e-6, "unfused_s": 4e-6, "slower": ["g2"], "tolerance": 0.05, "groups": [
        {"group": "g1", "ops": ["Conv", "Relu"], "fused_s": 1e-6, "unfused_s": 2e-6, "slower": False},
        {"group": "g2", "ops": ["Relu", "GlobalAveragePool"], "fused_s": 2e-6, "unfused_s": 1e-6, "slower": True}]}
    (tmp_path / "bench_a_t1.json").write_text(json.dumps(res))
    r = subprocess.run([sys.executable, str(script), "a", "--threads", "1", "--results", str(tmp_path), "--table-only"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "bench.md").read_text()
    assert "| a | 1 | 0.003 | 0.004 | - | - | - | g2 (Relu+GlobalAveragePool) 2.0 vs 1.0 us |" in md
    assert "g1 (" not in md
    res["group_check"]["memory_bound"] = {"unfused_s": 4e-6, "left_s": 1e-6, "removed": 0.75}
    (tmp_path / "bench_a_t1.json").write_text(json.dumps(res))
    r = subprocess.run([sys.executable, str(script), "a", "--threads", "1", "--results", str(tmp_path), "--table-only"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "| a | 1 | 0.003 | 0.004 | 0.004 | 0.001 | 75% | g2 (" in (tmp_path / "bench.md").read_text()


def test_group_check_sets_each_fused_group_against_its_ops_unfused():
    from opfuse.measure import GROUP_SLOWER_TOLERANCE, group_check
    res = group_check("zoo:ds_cnn", repeat=3)
    rows = res["groups"]
    assert rows and res["tolerance"] == GROUP_SLOWER_TOLERANCE
    assert res["clock"] == "thread_cpu"  # one thread: kernel timers on the thread's CPU clock
    fused = [r for r in rows if len(r["origin"]) > 1]
    assert fused, "ds_cnn has fused groups (Conv+BN+Relu)"
    for r in rows:
        assert r["fused_s"] > 0 and r["unfused_s"] > 0
        assert set(r["origin"]) <= set(r["unfused_kernels"])
        assert r["slower"] == (r["moved"] is None and len(r["unfused_kernels"]) > 1
                               and r["fused_s"] > r["unfused_s"] * (1 + GROUP_SLOWER_TOLERANCE))
        assert r["ratio"] == pytest.approx(r["fused_s"] / r["unfused_s"])
    assert res["slower"] == [r["group"] for r in rows if r["slower"]]
    assert res["fused_s"] == pytest.approx(sum(r["fused_s"] for r in rows))
    mem = res["memory_bound"]  # ds_cnn's BatchNorm and Relu kernels are memory-bound unfused
    assert mem["kernels"] > 0 and mem["unfused_s"] > 0
    assert all(r["anchor_kernels"] == [r["group"]] for r in fused)  # the Conv's own kernel
    assert mem["left_s"] == pytest.approx(sum(r["memory_left_s"] or 0.0 for r in rows))
    assert mem["removed"] == pytest.approx(1 - mem["left_s"] / mem["unfused_s"])
    with pytest.raises(OpfuseError, match="repeat"):
        group_check("zoo:ds_cnn", repeat=0)


def test_memory_bound_removed_charges_each_group_its_time_beyond_its_anchor():
    from opfuse.measure import memory_bound_removed
    t_unfused = {"conv": 10e-6, "bn": 3e-6, "relu": 2e-6, "dw": 6e-6, "dw_relu": 1e-6, "pool": 4e-6, "reshape": 1e-6,
                 "fc": 5e-6}
    bound = {"conv": "compute", "bn": "memory", "relu": "memory", "dw": "memory", "dw_relu": "memory",
             "pool": "memory", "reshape": "memory", "fc": "compute"}
    rows = [{"group": "conv", "fused_s": 11e-6, "unfused_kernels": ["conv", "bn", "relu"]},  # 1 us over the conv
            # a memory-bound anchor: it runs fused too, so it is on neither side
            {"group": "dw", "fused_s": 6.5e-6, "unfused_kernels": ["dw", "dw_relu"], "anchor_kernels": ["dw"]},
            {"group": "pool", "fused_s": 4.5e-6, "unfused_kernels": ["pool"], "anchor_kernels": ["pool"]},  # alone
            {"group": "fc", "fused_s": 5e-6, "unfused_kernels": ["fc"]}]  # compute only: not counted
    res = memory_bound_removed(rows, t_unfused, bound)  # "reshape" became a view: no fused kernel
    assert res["unfused_s"] == pytest.approx(11e-6) and res["kernels"] == 5  # bn relu dw_relu pool reshape
    assert res["left_s"] == pytest.approx(6e-6) and res["removed"] == pytest.approx(5 / 11)
    assert res["uncounted_s"] == pytest.approx(1e-6)
    assert (rows[0]["memory_unfused_s"], rows[0]["memory_left_s"]) == pytest.approx((5e-6, 1e-6))
    assert (rows[1]["memory_unfused_s"], rows[1]["memory_left_s"]) == pytest.approx((1e-6, 0.5e-6))
    assert (rows[2]["memory_unfused_s"], rows[2]["memory_left_s"]) == pytest.approx((4e-6, 4.5e-6))
    assert rows[3]["memory_unfused_s"] is None and rows[3]["memory_left_s"] is None
    assert res["unfused_kernels"]["dw"] == {"s": 6e-6, "bound": "memory"}
    rows[0]["fused_s"] = 9e-6  # the fused conv ran 1 us faster than the unfused one: it offsets the others' 5
    assert memory_bound_removed(rows, t_unfused, bound)["left_s"] == pytest.approx(4e-6)
    assert rows[0]["memory_left_s"] == pytest.approx(-1e-6)
    rows[0]["fused_s"] = 11e-6
    copy = [*rows, {"group": "split", "fused_s": 2e-6, "unfused_kernels": []}]  # views unfused, a copy fused
    res = memory_bound_removed(copy, t_unfused, bound)
    assert res["left_s"] == pytest.approx(8e-6) and copy[-1]["memory_left_s"] == 2e-6
    # Paired by round: the conv ran 10, 14, 10 us unfused and its group 11, 15, 11 fused: 1 us over it in
    # each round, where the medians (11 and 10) would say 1 too but (15 - 10) had the 14 fallen elsewhere.
    runs = [{"conv": [11e-6, 15e-6, 11e-6]}, {"conv": [10e-6, 14e-6, 10e-6], "bn": [3e-6] * 3, "relu": [2e-6] * 3}]
    paired = [dict(rows[0], fused_s=15e-6)]  # a fused median that met the slow round
    memory_bound_removed(paired, t_unfused, bound, runs=runs)
    assert paired[0]["memory_left_s"] == pytest.approx(1e-6)
    none = memory_bound_removed(rows[3:], {"fc": 5e-6}, {"fc": "compute"})
    assert none["removed"] is None and none["unfused_s"] == 0
    gemv = memory_bound_removed(rows[3:], {"fc": 5e-6}, {"fc": "memory"}, contractions={"fc"})  # a classifier
    assert gemv["removed"] is None and gemv["kernels"] == 0 and rows[3]["memory_left_s"] is None


def test_memory_bound_removed_sums_the_rows_as_they_are():
    """Epilogues that cost nothing leave paired differences as often below 0 as above: summed as they are
    they say nothing is left, where each row held at 0 would have added up to 4 us left (and 20% "removed")."""
    from opfuse.measure import memory_bound_removed
    t_unfused, bound, rows = {}, {}, []
    runs: list[dict[str, list[float]]] = [{}, {}]
    for i, noise in enumerate((1e-6, -1e-6) * 4):  # the same 10 us conv both sides, +-1 us in each round
        conv, relu = f"conv{i}", f"relu{i}"
        t_unfused.update({conv: 10e-6, relu: 1e-6})
        bound.update({conv: "compute", relu: "memory"})
        runs[0][conv], runs[1][conv], runs[1][relu] = [10e-6 + noise] * 3, [10e-6] * 3, [1e-6] * 3
        rows.append({"group": conv, "fused_s": 10e-6 + noise, "unfused_kernels": [conv, relu]})
    res = memory_bound_removed(rows, t_unfused, bound, runs=runs)
    assert [r["memory_left_s"] for r in rows] == pytest.approx([1e-6, -1e-6] * 4)
    assert res["left_s"] == pytest.approx(0.0, abs=1e-12) and res["removed"] == pytest.approx(1.0)
    assert sum(max(r["memory_left_s"], 0.0) for r in rows) == pytest.approx(4e-6)  # what holding rows at 0 says
    assert res["interval"]["low"] == pytest.approx(1.0) == res["interval"]["high"]  # every round says the same
    rows[0]["fused_s"] = runs[0]["conv0"][0] = 7e-6  # 3 us faster than its conv: more than all, within the noise
    runs[0]["conv0"] = [7e-6] * 3
    res = memory_bound_removed(rows, t_unfused, bound, runs=runs)
    assert res["left_s"] == pytest.approx(-4e-6) and res["removed"] == pytest.approx(1.5)


def test_group_check_calls_data_movement_memory_bound():
    """An unfused Concat copies its inputs but the roofline prices it as zero-copy (no bytes, no FLOPs:
    "compute"); ``group_check`` calls every data-movement kernel memory-bound."""
    from opfuse.measure import group_check
    from opfuse.ops import GraphBuilder
    b = GraphBuilder("cat")
    x, y = b.input("x", (1, 8, 16, 16)), b.input("y", (1, 8, 16, 16))
    z = b.op("Concat", b.op("Relu", x, name="rx"), b.op("Relu", y, name="ry"), name="cat", axis=1)
    res = group_check(b.build(b.op("Sigmoid", z, name="sig")), repeat=1)
    kernels = res["memory_bound"]["unfused_kernels"]
    assert kernels["cat"]["bound"] == "memory" and kernels["rx"]["bound"] == "memory"


def test_group_check_counts_the_casts_a_float16_op_is_rewritten_with():
    """float32_compute's Casts have no original op: their unfused kernels still count for the fused
    group that holds them, so a float16 chain is set against all 7 unfused kernels, not 3."""
    from opfuse.measure import group_check
    from opfuse.ops import GraphBuilder
    b = GraphBuilder("chain16")
    x = b.input("x", (4, 64), np.float16)
    y = b.op("Sigmoid", b.op("Mul", b.op("Relu", x, name="relu"), b.const("w", np.ones(64, np.float16)), name="mul"),
             name="sigmoid")
    res = group_check(b.build(y), repeat=1)
    [row] = res["groups"]
    assert sorted(row["origin"]) == ["mul", "relu", "sigmoid"]
    assert len(row["unfused_kernels"]) == 7 and set(row["origin"]) <= set(row["unfused_kernels"])
    assert row["unfused_s"] > 0


def test_bench_groups_flag_prints_the_per_group_table(capsys):
    code = main(["bench", "zoo:ds_cnn", "--vs", "none", "--repeat", "2", "--warmup", "0", "--groups", "-q"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert "per group, kernel timers" in out and "fused / unfused" in out and "dw1" in out
    assert "memory-bound kernels:" in out and "removed" in out


def _row(name: str, f: float, u: float) -> dict:
    return {"group": name, "fused_s": f, "unfused_s": u, "slower": f > u * 1.05, "moved": None}


def _fake_groups():
    """conv -> pool: ``pool`` reads the value ``conv`` writes."""
    from types import SimpleNamespace as NS
    v = NS(name="c")
    conv = NS(name="conv", nodes=[NS(outputs=[v])], inputs=lambda: [])
    pool = NS(name="pool", nodes=[NS(outputs=[NS(name="p")])], inputs=lambda: [v])
    return [conv, pool]


def test_group_slower_only_by_its_producers_time_is_moved_not_slower():
    from opfuse.measure import _with_producers
    rows = [_row("conv", 2.40, 2.60), _row("pool", 0.24, 0.18)]  # resnet18's conv1 -> Relu+MaxPool, ms
    _with_producers(rows, _fake_groups())
    assert not rows[1]["slower"]
    assert rows[1]["moved"]["producers"] == ["conv"]
    assert rows[1]["moved"]["ratio"] == pytest.approx(2.64 / 2.78)
    assert rows[1]["fused_s"] == 0.24  # its own numbers stay
    from opfuse.cli import _moved_note
    assert _moved_note(rows[1]["moved"]) == "moved: 0.95 with producer" and _moved_note(None) == ""


def test_group_slower_with_its_producers_stays_slower():
    from opfuse.measure import _with_producers
    rows = [_row("conv", 2.60, 2.60), _row("pool", 0.40, 0.18)]
    _with_producers(rows, _fake_groups())
    assert rows[1]["slower"] and rows[1]["moved"] is None
    rows = [_row("conv", 2.40, 2.60), _row("pool", 0.24, 0.18)]
    _with_producers(rows, _fake_groups()[1:])  # no producing group timed: nothing to set it against
    assert rows[1]["slower"] and rows[1]["moved"] is None


def test_memory_bound_removed_states_how_far_the_figure_moves_with_the_rounds():
    from opfuse.measure import MEMORY_BOUND_INTERVAL, memory_bound_removed
    bound = {"conv": "compute", "bn": "memory", "relu": "memory"}
    t_unfused = {"conv": 10e-6, "bn": 3e-6, "relu": 2e-6}
    rows = [{"group": "conv", "fused_s": 11e-6, "unfused_kernels": ["conv", "bn", "relu"]}]
    assert memory_bound_removed(rows, t_unfused, bound)["interval"] is None  # no rounds: nothing to resample
    steady = [{"conv": [11e-6] * 5}, {"conv": [10e-6] * 5, "bn": [3e-6] * 5, "relu": [2e-6] * 5}]
    iv = memory_bound_removed(rows, t_unfused, bound, runs=steady)["interval"]
    assert iv["low"] == pytest.approx(0.8) and iv["high"] == pytest.approx(0.8)  # every round says 1 us of 5
    assert (iv["share"], iv["rounds"], iv["resamples"]) == (MEMORY_BOUND_INTERVAL, 5, 200)
    # The paired difference 1, 1, 1, 4, 0 us over a Conv: the point figure takes the median (1 us of 5 left);
    # resampled rounds see 0 to 4 us left, so the interval spans the figure and is not a point.
    noisy = [{"conv": [11e-6, 12e-6, 11e-6, 15e-6, 10e-6]},
             {"conv": [10e-6, 11e-6, 10e-6, 11e-6, 10e-6], "bn": [3e-6] * 5, "relu": [2e-6] * 5}]
    res = memory_bound_removed([dict(rows[0])], t_unfused, bound, runs=noisy)
    iv = res["interval"]
    assert res["removed"] == pytest.approx(0.8)
    assert iv["low"] < 0.8 <= iv["high"] and iv["low"] >= 1 - 4 / 5 - 1e-9 and iv["high"] <= 1.0
    assert memory_bound_removed([dict(rows[0])], t_unfused, bound, runs=noisy)["interval"] == iv  # same seed


def test_the_group_check_runs_its_own_rounds():
    from opfuse.bench import GROUP_CHECK_REPEAT, bench
    res = bench("zoo:ds_cnn", vs="none", threads=1, repeat=1, warmup=0, yardsticks=False, groups=True,
                group_repeat=2)
    assert res["repeat"] == 1 and res["group_check"]["repeat"] == 2
    assert res["group_check"]["memory_bound"]["interval"]["rounds"] == 2
    res = bench("zoo:ds_cnn", vs="none", threads=1, repeat=1, warmup=0, yardsticks=False, groups=True)
    assert res["group_check"]["repeat"] == GROUP_CHECK_REPEAT  # by default more rounds than a quick --repeat
