"""Host calibration: the on-disk cache (reuse, corruption, foreign machine) and the
micro-benchmarks themselves (a quick run, C and NumPy)."""
import json

import pytest

from opfuse.targets import calibrate_host, get_profile
from opfuse.targets.calibrate import CACHE_FILE, profile_from_measurement
from opfuse.targets.microbench import QUICK, Measurement, find_compiler, measure_with_c, measure_with_numpy


class CountingMeasure:
    """Stands in for the micro-benchmarks: fixed numbers, counts its calls."""

    def __init__(self, bandwidth=10e9):
        self.calls = 0
        self.bandwidth = bandwidth

    def __call__(self):
        self.calls += 1
        return Measurement(bandwidth_Bps=self.bandwidth, peak_flops={"float32": 50e9, "float64": 25e9},
                           call_overhead_s=2e-9, dram_latency_s=1e-7, method="fake")


def test_first_use_measures_then_the_cache_is_reused(tmp_path):
    path = tmp_path / CACHE_FILE
    m = CountingMeasure()
    p1 = calibrate_host(cache_path=path, measure=m)
    p2 = calibrate_host(cache_path=path, measure=m)
    assert m.calls == 1 and p1 == p2
    assert p1.calibrated and p1.name == "host" and p1.mem_bandwidth == 10e9
    assert p1.peak_for("float16") == 50e9  # generated C computes half in float32
    assert p1.memory_parallelism == round(10e9 * 1e-7 / p1.cache_line_bytes)  # Little's law
    calibrate_host(force=True, cache_path=path, measure=m)
    assert m.calls == 2


@pytest.mark.parametrize("content", ["{\"fingerprint\": ", "", "[1, 2]", "\x00\xff garbage",
                                     "{\"fingerprint\": {}, \"profile\": {}}"])
def test_corrupt_or_foreign_cache_is_rebuilt(tmp_path, content):
    path = tmp_path / CACHE_FILE
    path.write_text(content, errors="surrogateescape")
    m = CountingMeasure()
    p = calibrate_host(cache_path=path, measure=m)
    assert m.calls == 1
    saved = json.loads(path.read_text())  # rewritten as valid JSON
    assert saved["profile"]["mem_bandwidth"] == p.mem_bandwidth
    assert calibrate_host(cache_path=path, measure=m) == p and m.calls == 1


def test_cache_with_a_bad_profile_inside_is_rebuilt(tmp_path):
    path = tmp_path / CACHE_FILE
    m = CountingMeasure()
    calibrate_host(cache_path=path, measure=m)
    data = json.loads(path.read_text())
    data["profile"]["mem_bandwidth"] = -1
    path.write_text(json.dumps(data))
    calibrate_host(cache_path=path, measure=CountingMeasure(bandwidth=7e9))
    assert json.loads(path.read_text())["profile"]["mem_bandwidth"] == 7e9


def test_get_profile_host_uses_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFUSE_CACHE_DIR", str(tmp_path))
    m = CountingMeasure()
    calibrate_host(measure=m)  # writes $OPFUSE_CACHE_DIR/host_profile.json
    assert (tmp_path / CACHE_FILE).exists()
    assert get_profile("host").mem_bandwidth == 10e9  # served from the cache, no measuring


def test_profile_from_measurement_reads_the_machine():
    p = profile_from_measurement(CountingMeasure()())
    assert p.onchip_bytes > 0 and p.vector_bytes in (16, 32, 64) and p.numa_nodes >= 1
    assert p.numa_remote_latency_s >= p.numa_local_latency_s


@pytest.mark.skipif(find_compiler() is None, reason="no C compiler on this machine")
def test_c_micro_benchmarks_give_plausible_numbers():
    m = measure_with_c(find_compiler(), QUICK)
    assert 1e8 < m.bandwidth_Bps < 1e13
    assert 1e8 < m.peak_flops["float32"] < 1e13 and m.peak_flops["float64"] > 1e7
    assert 0 < m.call_overhead_s < 1e-5 and 0 < m.dram_latency_s < 1e-5
    assert m.method.startswith("c: ") and "-O3 -march=native" in m.method


def test_numpy_fallback_gives_plausible_numbers():
    m = measure_with_numpy(QUICK)
    assert m.bandwidth_Bps > 1e7 and m.peak_flops["float32"] > 1e6 and m.call_overhead_s > 0
    assert m.dram_latency_s is None and m.method == "numpy"
