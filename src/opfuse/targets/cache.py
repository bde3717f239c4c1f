"""The on-disk cache: where calibrations and fitted corrections live, and atomic JSON I/O.

The directory is ``$OPFUSE_CACHE_DIR`` when set, else ``~/.cache/opfuse``. Writes go to a
temporary file in the same directory followed by ``os.replace``, so a reader sees either
the old file or the new one, never a half-written one (two processes calibrating at
once simply both write a complete file; the last one wins).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

CACHE_ENV = "OPFUSE_CACHE_DIR"


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path.home() / ".cache" / "opfuse"


def atomic_write_json(path: Path, data) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_json_or_none(path: Path):
    """The parsed JSON at ``path``, or ``None`` when it is missing or corrupt."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
