"""``opfuse compile --measure``: per group, the achieved rate next to the machine's yardsticks."""
import json
import re

from opfuse.cli import main
from opfuse.measure import achieved_rate


def test_measure_prints_achieved_rates_and_yardsticks(capsys, tmp_path):
    rj = tmp_path / "r.json"
    code = main(["compile", "zoo:resnet8", "--measure", "--repeat", "3", "--report-json", str(rj)])
    out, err = capsys.readouterr()
    assert code == 0, err
    rep = json.loads(rj.read_text())
    ys = rep["yardsticks"]
    assert ys["sgemm_gflops"] > 0 and ys["copy_gbps"] > 0 and ys["sgemm_n"] == 1024
    assert re.search(r"yardsticks \(timed now\): NumPy sgemm n=1024 one thread [\d.]+ GFLOP/s, np.copyto [\d.]+ GB/s",
                     out)
    conv = next(g for g in rep["groups"] if g["name"] == "stack1_conv1")
    rate, unit = achieved_rate(conv, ys["sgemm_gflops"] / ys["copy_gbps"])
    assert unit == "GFLOP/s" and rate == conv["flops"] / conv["measured_latency_s"] / 1e9
    row = next(line for line in out.splitlines() if line.startswith("stack1_conv1"))
    assert "GFLOP/s" in row and row.rstrip().endswith("%")


def test_achieved_rate_follows_the_roofline_verdict():
    g = {"measured_latency_s": 1e-3, "flops": 2_000_000, "bytes_after": 4_000_000, "arithmetic_intensity": 0.5}
    assert achieved_rate({**g, "bound": "compute"}, 10.0) == (2.0, "GFLOP/s")
    assert achieved_rate({**g, "bound": "memory"}, 10.0) == (4.0, "GB/s")
    assert achieved_rate(g, 10.0) == (4.0, "GB/s")  # no verdict: intensity 0.5 is below the ridge
    assert achieved_rate(g, 0.25) == (2.0, "GFLOP/s")
    assert achieved_rate({"flops": 1}, 1.0) is None
