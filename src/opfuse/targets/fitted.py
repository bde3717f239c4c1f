"""The ``cortex-m7`` profile: fitted from emulated instruction counts when a fit is saved, else the data sheet.

``opfuse profile --target cortex-m7 --fit`` (``opfuse.mcufit``) runs micro-benchmark kernels under
QEMU, fits instructions per FLOP of each op class, per byte moved and per kernel call by least
squares, and saves the result here (``cortex-m7_profile.json`` in the cache directory) with a
*fingerprint*: the fit's version and the cross compiler's and emulator's versions. Later plans for
``cortex-m7`` use the saved fit while the fingerprint matches (the tools that produced the counts
are still the ones installed); otherwise the data-sheet profile (``builtin.cortex_m7``), whose
notes say why. Like the host calibration, nothing is measured implicitly: plans depend only on a
fit the user made on purpose.
"""
from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

from opfuse.targets.builtin import cortex_m7
from opfuse.targets.cache import atomic_write_json, cache_dir, read_json_or_none
from opfuse.targets.profile import HardwareProfile, ProfileError

M7_FIT_VERSION = 1
M7_FIT_FILE = "cortex-m7_profile.json"
M7_FIT_COMMAND = "opfuse profile --target cortex-m7 --fit"
M7_FIT_SOURCE = "qemu instruction counts"
TOOLS = ("arm-none-eabi-gcc", "qemu-system-arm")


@functools.lru_cache(maxsize=1)
def _tool_versions() -> tuple[tuple[str, str], ...]:
    out = []
    for tool in TOOLS:
        path = shutil.which(tool)
        version = "missing"
        if path is not None:
            try:
                proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=False)
                version = (proc.stdout.splitlines() or [tool])[0].strip()
            except (OSError, subprocess.SubprocessError):
                version = "unusable"
        out.append((tool, version))
    return tuple(out)


def m7_fingerprint() -> dict:
    return {"fit_version": M7_FIT_VERSION, **dict(_tool_versions())}


def m7_fit_path() -> Path:
    return cache_dir() / M7_FIT_FILE


def saved_m7_fit(path: Path | None = None) -> tuple[HardwareProfile | None, str]:
    """(the saved fit, "") when one is valid for the installed tools, else (None, why not)."""
    where = Path(path) if path is not None else m7_fit_path()
    if not where.exists():
        return None, "no saved fit"
    saved = read_json_or_none(where)
    if not isinstance(saved, dict):
        return None, f"the saved fit {where} is unreadable"
    if saved.get("fingerprint") != m7_fingerprint():
        return None, f"the saved fit {where} is for another compiler, emulator or fit version"
    try:
        profile = HardwareProfile.from_dict(saved.get("profile") or {}, where=str(where))
    except ProfileError:
        return None, f"the saved fit {where} is invalid"
    if profile.name != "cortex-m7" or not profile.instruction_costs:
        return None, f"the saved fit {where} is invalid"
    return profile, ""


def m7_profile(path: Path | None = None) -> HardwareProfile:
    """What planning uses for ``cortex-m7``: the saved fit, else the data sheet (noting why)."""
    saved, why = saved_m7_fit(path)
    if saved is not None:
        return saved
    sheet = cortex_m7()
    if why == "no saved fit":
        return sheet
    return sheet.with_overrides(notes=(*sheet.notes, f"data sheet: {why}; `{M7_FIT_COMMAND}` refits"))


def save_m7_fit(profile: HardwareProfile, extra: dict | None = None, path: Path | None = None) -> Path:
    """Save a fitted profile (and ``extra``: the fit's samples and errors, for the record)."""
    where = Path(path) if path is not None else m7_fit_path()
    atomic_write_json(where, {"fingerprint": m7_fingerprint(), "profile": profile.to_dict(), "fit": extra or {}})
    return where
