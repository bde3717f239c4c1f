"""The on-disk cache: where calibrations and fitted corrections live, and atomic JSON I/O.

The directory is ``opfuse.files.cache_dir()``: ``$OPFUSE_CACHE_DIR`` (``~`` expanded) when set,
else ``~/.cache/opfuse``, the same root as the build cache. Writes go to a temporary file in the
same directory followed by ``os.replace``, so a reader sees either the old file or the new one,
never a half-written one (and ``calibrate_host`` holds a lock, so two processes never measure
at once). Cache folders are created 0700 and cache files 0600; a write that fails (a
read-only or full disk, a file where the folder should be) is a one-line ``StorageError``.
"""
from __future__ import annotations

import json
from pathlib import Path

from opfuse.files import CACHE_ENV, atomic_writer, cache_dir, private_dir

__all__ = ["CACHE_ENV", "atomic_write_json", "cache_dir", "read_json_or_none"]


def atomic_write_json(path: Path, data, *, private: bool = True) -> None:
    """Write ``data`` as JSON; ``private`` (the default, for cache files): folders 0700, file 0600."""
    path = Path(path)
    if private:
        private_dir(path.parent, "cache")
    with atomic_writer(path, private=private) as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def read_json_or_none(path: Path):
    """The parsed JSON at ``path``, or ``None`` when it is missing or corrupt."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
