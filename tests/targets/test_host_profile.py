"""The host profile is explicit: nominal constants until `opfuse profile --target host --calibrate`
saves a calibration; planning never times anything."""
import json

import pytest

from opfuse.cli import main
from opfuse.targets import calibrate_host, describe_profile, get_profile, host_profile, nominal_host_profile
from opfuse.targets import calibrate as calibrate_mod
from opfuse.targets.calibrate import (CACHE_FILE, NOMINAL_HOST_BANDWIDTH_BPS, NOMINAL_HOST_CALL_OVERHEAD_S,
                                      NOMINAL_HOST_FP32_FLOPS, NOMINAL_HOST_FP64_FLOPS)
from opfuse.targets.microbench import Measurement


def fake_measurement(bandwidth=10e9):
    return Measurement(bandwidth_Bps=bandwidth, peak_flops={"float32": 50e9, "float64": 25e9},
                       call_overhead_s=2e-9, dram_latency_s=1e-7, method="fake")


@pytest.fixture
def no_timing(monkeypatch):
    """Any timing run fails the test."""
    def boom(*a, **k):
        raise AssertionError("a timing calibration ran")
    monkeypatch.setattr(calibrate_mod, "default_measure", boom)
    monkeypatch.setattr(calibrate_mod, "measure_with_c", boom)
    monkeypatch.setattr(calibrate_mod, "measure_with_numpy", boom)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFUSE_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_without_a_saved_calibration_host_is_nominal_and_nothing_is_measured_or_written(cache, no_timing):
    p = get_profile("host")
    assert p == nominal_host_profile() == get_profile("host")
    assert not p.calibrated and p.source == "nominal"
    assert p.mem_bandwidth == NOMINAL_HOST_BANDWIDTH_BPS == 22e9
    assert p.peak_for("float32") == NOMINAL_HOST_FP32_FLOPS and p.peak_for("float64") == NOMINAL_HOST_FP64_FLOPS
    assert p.peak_for("float16") == NOMINAL_HOST_FP32_FLOPS and p.launch_overhead_s == NOMINAL_HOST_CALL_OVERHEAD_S
    assert "no saved calibration" in p.notes[0] and "--calibrate" in p.notes[0]
    assert list(cache.iterdir()) == []
    line = describe_profile(p)
    assert line.startswith("host profile: nominal constants (no saved calibration;") and "--calibrate" in line


def test_an_explicit_calibration_is_saved_and_used_by_later_plans(cache, monkeypatch):
    m = calibrate_host(force=True, measure=lambda: fake_measurement(7e9))
    assert (cache / CACHE_FILE).exists() and m.calibrated
    monkeypatch.setattr(calibrate_mod, "default_measure", lambda: pytest.fail("measured again"))
    p = get_profile("host")
    assert p == m and p.mem_bandwidth == 7e9
    line = describe_profile(p)
    assert line.startswith("host profile: saved calibration of 20") and "fake" in line


def test_a_calibration_for_another_machine_is_not_used(cache, no_timing):
    calibrate_host(force=True, measure=fake_measurement)
    data = json.loads((cache / CACHE_FILE).read_text())
    data["fingerprint"]["cpu"] = "some other CPU"
    (cache / CACHE_FILE).write_text(json.dumps(data))
    p = host_profile()
    assert p.source == "nominal" and p.mem_bandwidth == NOMINAL_HOST_BANDWIDTH_BPS
    assert "another machine or compiler" in describe_profile(p)
    (cache / CACHE_FILE).write_text("{broken")
    assert "unreadable" in describe_profile(host_profile())


def test_cli_profile_host_shows_the_nominal_profile_without_measuring(cache, no_timing, capsys):
    assert main(["profile", "--target", "host"]) == 0
    out = capsys.readouterr().out
    assert "source            nominal" in out and "22 GB/s" in out and "--calibrate" in out
    assert not (cache / CACHE_FILE).exists()


def test_cli_profile_calibrate_saves_and_is_host_only(cache, monkeypatch, capsys):
    monkeypatch.setattr(calibrate_mod, "default_measure", lambda: fake_measurement(9e9))
    assert main(["profile", "--target", "host", "--calibrate"]) == 0
    out = capsys.readouterr().out
    assert "saved it to" in out and "9 GB/s" in out and "(calibrated)" in out
    assert get_profile("host").mem_bandwidth == 9e9
    assert main(["profile", "--target", "cortex-m7", "--calibrate"]) == 2
    assert "host" in capsys.readouterr().err
