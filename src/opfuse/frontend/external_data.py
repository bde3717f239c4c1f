"""External tensor data, read only from inside the model's folder.

An ONNX tensor may keep its bytes in another file: ``data_location = EXTERNAL`` and
``external_data`` entries ``location`` (a path relative to the model file), ``offset``,
``length`` and optionally ``checksum`` (SHA-1 of the bytes). A model is untrusted input, so a
location is accepted only when it is relative and, after resolving ``..`` and symbolic links,
still names a regular file inside the model's folder; anything else is a ``SecurityError``.
We check this ourselves instead of relying on onnx's loader, and read the bytes ourselves.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import PurePosixPath, PureWindowsPath

from onnx import TensorProto

from opfuse.errors import ModelError, SecurityError


def uses_external_data(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL


def external_entries(tensor: TensorProto, what: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    for kv in tensor.external_data:
        if kv.key in entries:
            raise ModelError(f"{what}: external data key '{kv.key}' is given twice")
        entries[kv.key] = kv.value
    if not entries.get("location"):
        raise ModelError(f"{what} is stored externally but names no location")
    return entries


def resolve_location(base_dir: str, location: str, what: str) -> str:
    """The real path of ``location`` inside ``base_dir``; ``SecurityError`` if it leaves it."""
    if "\x00" in location:
        raise SecurityError(f"external data location {location!r} of {what} contains a NUL byte")
    if (os.path.isabs(location) or PurePosixPath(location).is_absolute()
            or PureWindowsPath(location).is_absolute() or PureWindowsPath(location).drive
            or location.startswith(("\\", "/"))):
        raise SecurityError(f"external data location {location!r} of {what} is an absolute path, "
                            f"outside the model folder; only paths relative to the model folder "
                            f"are allowed")
    root = os.path.realpath(base_dir)
    # Normalise Windows separators too, so "..\\x" cannot slip past the check on POSIX.
    target = os.path.realpath(os.path.join(root, location.replace("\\", "/")))
    if os.path.commonpath([root, target]) != root:
        raise SecurityError(f"external data location {location!r} of {what} points outside the "
                            f"model folder ({base_dir})")
    if not os.path.exists(target):
        raise ModelError(f"external data file {location!r} of {what} does not exist in {base_dir}")
    if not os.path.isfile(target):
        raise ModelError(f"external data location {location!r} of {what} is not a regular file")
    return target


def _int_entry(entries: dict[str, str], key: str, what: str) -> int | None:
    if key not in entries:
        return None
    try:
        n = int(entries[key])
    except ValueError:
        raise ModelError(f"{what}: external data {key} {entries[key]!r} is not an integer") from None
    if n < 0:
        raise ModelError(f"{what}: external data {key} {n} is negative")
    return n


def read_external_bytes(tensor: TensorProto, base_dir: str | None, what: str) -> bytes:
    entries = external_entries(tensor, what)
    if base_dir is None:
        raise ModelError(f"{what} is stored in external file {entries['location']!r}, but no model "
                         f"folder is known (load the model from its file, or pass base_dir)")
    path = resolve_location(base_dir, entries["location"], what)
    offset = _int_entry(entries, "offset", what) or 0
    length = _int_entry(entries, "length", what)
    size = os.path.getsize(path)
    end = size if length is None else offset + length
    if offset > size or end > size:
        raise ModelError(f"{what}: external file {entries['location']!r} is {size} bytes, too short for "
                         f"offset {offset} and length {length} (truncated?)")
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(end - offset)
    except OSError as e:
        raise ModelError(f"cannot read external data of {what}: {e.strerror or e}") from None
    if "checksum" in entries and hashlib.sha1(data).hexdigest() != entries["checksum"].lower():
        raise ModelError(f"{what}: external data checksum does not match (corrupted file?)")
    return data


def inline_external_data(tensor: TensorProto, base_dir: str | None, what: str) -> TensorProto:
    """A copy of ``tensor`` with its external bytes read (safely) into ``raw_data``."""
    data = read_external_bytes(tensor, base_dir, what)
    inlined = TensorProto()
    inlined.CopyFrom(tensor)
    del inlined.external_data[:]
    inlined.data_location = TensorProto.DEFAULT
    inlined.raw_data = data
    return inlined
