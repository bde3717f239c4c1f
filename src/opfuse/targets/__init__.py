"""Hardware targets: ``HardwareProfile`` and the built-in profiles.

    from opfuse.targets import get_profile, format_profile
    m7 = get_profile("cortex-m7")          # the saved QEMU fit, else the data sheet (400 MHz, 512 KB SRAM)
    host = get_profile("host")             # the saved calibration, else nominal constants (never measures)
    print(format_profile(host))

``get_profile`` also accepts the path of a profile JSON file (as ``save_profile`` writes).
"""
from __future__ import annotations

from pathlib import Path

from opfuse.targets.builtin import BUILTIN_PROFILES
from opfuse.targets.fitted import M7_FIT_COMMAND, M7_FIT_SOURCE, m7_profile, save_m7_fit, saved_m7_fit
from opfuse.targets.calibrate import (calibrate_host, describe_profile, host_full_width_fma, host_profile,
                                      host_simd_isa, nominal_host_profile, saved_host_calibration)
from opfuse.targets.profile import (HardwareProfile, ProfileError, format_profile, load_profile,
                                    save_profile)

HOST = "host"


def list_profiles() -> list[str]:
    """Names ``get_profile`` knows, sorted."""
    return sorted([*BUILTIN_PROFILES, HOST])


def get_profile(name: str) -> HardwareProfile:
    """A built-in profile by name, ``"host"`` (the calibration saved by ``opfuse profile --target
    host --calibrate``, else the nominal host profile; nothing is measured here), or a profile
    JSON file."""
    if name == HOST:
        return host_profile()
    if name == "cortex-m7":  # the fit saved by `opfuse profile --target cortex-m7 --fit`, else the data sheet
        return m7_profile()
    if name in BUILTIN_PROFILES:
        return BUILTIN_PROFILES[name]()
    if name.endswith(".json") or Path(name).is_file():
        return load_profile(name)
    raise ProfileError(f"unknown target '{name}'; known targets: {', '.join(list_profiles())} "
                       f"(or the path of a profile .json file)")


__all__ = ["M7_FIT_COMMAND", "M7_FIT_SOURCE", "HardwareProfile", "ProfileError", "calibrate_host", "describe_profile",
           "format_profile", "get_profile", "host_full_width_fma", "host_profile", "host_simd_isa", "list_profiles",
           "load_profile", "m7_profile", "nominal_host_profile", "save_m7_fit", "save_profile",
           "saved_host_calibration", "saved_m7_fit"]
