"""Built-in profiles, lookup by name, JSON round trip, validation and the text form."""
import json

import numpy as np
import pytest

from opfuse.errors import OpfuseError
from opfuse.targets import (HardwareProfile, ProfileError, format_profile, get_profile, list_profiles,
                            load_profile, save_profile)


def test_list_profiles_names_every_builtin_and_host():
    assert list_profiles() == ["a100", "cortex-m7", "h200", "host"]


def test_cortex_m7_matches_the_seed_case_study():
    m7 = get_profile("cortex-m7")
    assert m7.mem_bandwidth == 400e6  # ~400 MB/s DRAM
    assert m7.onchip_bytes == 512 * 1024  # 512 KB SRAM
    assert m7.peak_for("float32") == 400e6 * 2  # 400 MHz x one FMA (2 FLOP) per cycle
    assert m7.ridge_point("float32") == pytest.approx(2.0)
    assert not m7.calibrated and m7.source == "datasheet"


@pytest.mark.parametrize("name,dtype,peak,bw", [("a100", "float16", 312e12, 2.039e12),
                                                 ("h200", "float16", 989e12, 4.8e12)])
def test_gpu_datasheet_numbers(name, dtype, peak, bw):
    p = get_profile(name)
    assert p.peak_for(dtype) == peak and p.mem_bandwidth == bw
    assert p.ridge_point(dtype) == pytest.approx(peak / bw)


def test_unknown_target_is_a_clear_user_error():
    with pytest.raises(ProfileError) as e:
        get_profile("tpu-v9")
    assert isinstance(e.value, OpfuseError)
    assert "unknown target 'tpu-v9'" in str(e.value) and "cortex-m7" in str(e.value)


def test_unlisted_dtype_gets_the_slowest_listed_peak():
    p = get_profile("cortex-m7")
    assert p.peak_for(np.int64) == min(p.peak_flops.values())
    assert p.peak_for(np.float16) == p.peak_flops["float16"]
    assert get_profile("h200").peak_for("bfloat16") == 989e12  # a name NumPy does not know


def test_save_and_load_round_trip(tmp_path):
    p = get_profile("cortex-m7").with_overrides(name="my-board", mem_bandwidth=800e6)
    path = save_profile(p, tmp_path / "board.json")
    assert load_profile(path) == p
    assert get_profile(str(path)) == p  # a profile file works wherever a target name does
    assert json.loads(path.read_text())["mem_bandwidth"] == 800e6
    assert [f.name for f in tmp_path.iterdir()] == ["board.json"]  # no temporary left behind


def test_load_rejects_corrupt_and_incomplete_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(bad)
    d = get_profile("a100").to_dict()
    del d["mem_bandwidth"]
    bad.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match="missing field"):
        load_profile(bad)
    d = get_profile("a100").to_dict()
    d["warp_size"] = 32
    bad.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match="unknown field"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(tmp_path / "missing.json")


@pytest.mark.parametrize("field,value,msg", [("mem_bandwidth", 0.0, "mem_bandwidth"),
                                             ("onchip_bytes", -1, "onchip_bytes"),
                                             ("peak_flops", {"float32": -5.0}, "peak_flops"),
                                             ("numa_remote_latency_s", 1e-9, "remote")])
def test_invalid_values_are_refused(field, value, msg):
    with pytest.raises(ProfileError, match=msg):
        get_profile("cortex-m7").with_overrides(**{field: value})


def test_format_profile_shows_the_roofline_numbers():
    text = format_profile(get_profile("cortex-m7"))
    assert "target            cortex-m7" in text
    assert "peak float32      800 MFLOP/s" in text and "ridge I_c = 2 FLOP/B" in text
    assert "memory bandwidth  400 MB/s" in text and "on-chip capacity  512 KiB" in text
    assert "note:" in text


def test_profile_is_plain_data():
    p = get_profile("h200")
    assert HardwareProfile.from_dict(p.to_dict()) == p
    assert p.vector_registers == p.register_bytes // p.vector_bytes
