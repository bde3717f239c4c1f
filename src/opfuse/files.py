"""Files and folders opfuse writes: private, atomic, and every OS failure as one line.

* ``cache_dir()``: the one root of the on-disk caches (built libraries, the host calibration,
  fitted corrections): ``$OPFUSE_CACHE_DIR`` with ``~`` expanded, else ``~/.cache/opfuse``.
* ``private_dir(path)``: ``mkdir -p`` whose new folders are ``0700`` (a cache may sit in a
  folder other users can read).
* ``atomic_write(path, data)``: a temporary file in the same folder, flushed, then renamed over
  ``path``: a full disk or a crash leaves the old file or none, never a truncated one. The file
  is ``0600`` when ``private`` is set, else the umask's usual mode.
* ``file_lock(path)``: an exclusive lock between processes (``flock``), for work that must run
  once: building one cache entry, calibrating the host.
* Every ``OSError`` (full disk, read-only folder, a file where a folder should be) becomes a
  ``StorageError`` naming the path and the cause, which the CLI prints as one line.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

from opfuse.errors import StorageError

CACHE_ENV = "OPFUSE_CACHE_DIR"


def storage_error(e: OSError, action: str, path: str | os.PathLike, hint: str = "") -> StorageError:
    """``cannot <action> '<path>': <cause>`` (the cause is the OS's short text, e.g. "No space left on device")."""
    cause = e.strerror or str(e) or type(e).__name__
    return StorageError(f"cannot {action} '{os.fspath(path)}': {cause}" + (f" ({hint})" if hint else ""))


def cache_dir() -> Path:
    """``$OPFUSE_CACHE_DIR`` (``~`` expanded), else ``~/.cache/opfuse``. Nothing is created here."""
    root = os.environ.get(CACHE_ENV, "").strip()
    try:
        return Path(root).expanduser() if root else Path.home() / ".cache" / "opfuse"
    except RuntimeError:  # no home directory to expand ~ to
        raise StorageError(f"cannot find the home directory for the cache folder; set ${CACHE_ENV}") from None


def private_dir(path: str | os.PathLike, what: str = "folder") -> Path:
    """``path`` as an existing folder, creating missing ones with mode 0700."""
    p = Path(path)
    hint = f"set ${CACHE_ENV} to a writable folder" if what.endswith("cache") else ""
    missing = []
    q = p
    while not q.is_dir():  # mkdir -p would create the parents with the umask's mode
        if q.exists() or q.is_symlink() or q.parent == q:
            raise StorageError(f"cannot use the {what} '{p}': '{q}' is not a folder" + (f" ({hint})" if hint else ""))
        missing.append(q)
        q = q.parent
    for q in reversed(missing):
        try:
            q.mkdir(mode=0o700, exist_ok=True)
        except OSError as e:
            raise storage_error(e, f"create the {what}", q, hint) from None
    return p


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, mode: str = "w", *, private: bool = False) -> Iterator[IO]:
    """Open a temporary file next to ``path`` for writing; it replaces ``path`` only if the block
    finishes. ``StorageError`` for any OS failure; the temporary file never stays behind."""
    path = Path(path)
    check_writable(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise storage_error(e, "write", path) from None
    try:
        if not private:  # mkstemp's 0600, unless the file is meant to be shared as usual
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise storage_error(e, "write", path) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def check_writable(path: str | os.PathLike, *, folder: bool = False) -> None:
    """``StorageError`` now when ``path`` cannot become the file (or, ``folder=True``, the folder) a
    command will write at its end: a folder where a file goes, a file where a folder goes, or a
    missing parent folder."""
    p = Path(path)
    if folder:
        if p.exists() and not p.is_dir():
            raise StorageError(f"cannot write into '{p}': it exists and is not a folder")
        return
    if p.is_dir():
        raise StorageError(f"cannot write '{p}': it is a folder")
    if not p.parent.is_dir():
        why = "is not a folder" if p.parent.exists() else "does not exist"
        raise StorageError(f"cannot write '{p}': '{p.parent}' {why}")


def atomic_write(path: str | os.PathLike, data: str | bytes, *, private: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (see ``atomic_writer``)."""
    with atomic_writer(path, "wb" if isinstance(data, bytes) else "w", private=private) as f:
        f.write(data)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on the file ``path`` (created 0600) for the block: another
    process asking for the same lock waits until this one leaves it. Yields ``True``; yields
    ``False`` (no lock, no error) where the file cannot be created, e.g. in a read-only folder,
    so a caller that only reads goes on and one that writes meets the real error itself.

    The file is removed on release. A waiter that opened it before the removal finds, once it
    holds the lock, that the path no longer names its file, and opens the new one: two
    processes never both hold the lock for the same path. The kernel releases the lock of a
    killed process."""
    import fcntl
    p = Path(path)
    while True:
        try:
            fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.stat(p).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)  # the holder before us removed it: lock the new file
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(p)
        os.close(fd)
