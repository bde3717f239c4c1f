"""The system C compiler and the on-disk build cache.

A build is keyed by the SHA-256 of the C source, the compiler flags and the compiler's
identity (its version and, for ``-march=native``, the target macros it defines on this
machine), so a cache shared between machines never hands out a library built for another
CPU. An entry is a directory ``<cache>/<key[:2]>/<key>/`` holding ``model.c``,
``libmodel.so`` and ``meta.json`` with the hashes of both files; an entry whose files are
missing, truncated or do not hash to what ``meta.json`` records is deleted and rebuilt.
Entries are built in a temporary directory and renamed into place, so a crash or a
concurrent build never leaves a half-written entry under the final name.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from opfuse.errors import OpfuseError

CACHE_ENV = "OPFUSE_CACHE_DIR"
COMPILER_ENV = "CC"
DEFAULT_CACHE = Path("~/.cache/opfuse")
COMPILE_TIMEOUT_S = 600
LIBRARY_NAME = "libmodel.so"
SOURCE_NAME = "model.c"
META_NAME = "meta.json"
CACHE_FORMAT = 1
# -ffp-contract=off: no fused multiply-add, so results do not depend on the CPU's FMA units.
# -fno-math-errno: libm calls never set errno (lets sqrtf inline); no effect on values.
# -fno-trapping-math: floating-point exceptions never trap (they do not: nothing enables them),
# so gcc may compute both arms of a ternary and select (the vectorised exp, log, tanh...); no
# effect on values.
BASE_FLAGS = ("-O3", "-std=c99", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math")
FAST_MATH_FLAGS = ("-ffast-math", "-ffp-contract=fast")


class ToolchainError(OpfuseError):
    """No usable C compiler: the native backend cannot run here."""


class CompileError(RuntimeError):
    """The C compiler rejected generated code (a bug in opfuse, so not an OpfuseError)."""


def find_compiler() -> str:
    """``$CC`` if set, else the first of cc, gcc, clang on PATH; ``ToolchainError`` if none."""
    candidates = [os.environ[COMPILER_ENV]] if os.environ.get(COMPILER_ENV) else ["cc", "gcc", "clang"]
    for name in candidates:
        path = shutil.which(name)
        if path:
            return path
    raise ToolchainError("no C compiler found (looked for " + ", ".join(candidates) + "); install gcc or "
                         "clang, or set $CC, or run with the reference backend (--backend reference)")


def _run(cmd: list[str], cwd: str | None = None, timeout: float = COMPILE_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


@functools.lru_cache(maxsize=None)
def compiler_identity(cc: str, native: bool) -> str:
    """Version line of ``cc`` plus a hash of the macros ``-march=native`` defines here."""
    ver = _run([cc, "--version"]).stdout.splitlines()
    ident = ver[0] if ver else cc
    if native:
        macros = _run([cc, "-march=native", "-dM", "-E", "-x", "c", os.devnull]).stdout
        ident += " native:" + hashlib.sha256(macros.encode()).hexdigest()[:16]
    return ident


@functools.lru_cache(maxsize=None)
def supports_openmp(cc: str) -> bool:
    with tempfile.TemporaryDirectory(prefix="opfuse-omp-") as d:
        src = Path(d, "t.c")
        src.write_text("#include <omp.h>\nint f(void) { return omp_get_max_threads(); }\n")
        return _run([cc, "-fopenmp", "-fPIC", "-shared", "-o", str(Path(d, "t.so")), str(src)]).returncode == 0


@dataclass(frozen=True)
class Toolchain:
    cc: str
    flags: tuple[str, ...]
    identity: str
    openmp: bool

    @classmethod
    def detect(cls, *, native: bool = True, fast_math: bool = False, openmp: bool = True) -> "Toolchain":
        cc = find_compiler()
        flags = list(BASE_FLAGS)
        if native:
            flags.append("-march=native")
        if fast_math:
            flags = [f for f in flags if f != "-ffp-contract=off"] + list(FAST_MATH_FLAGS)
        omp = openmp and supports_openmp(cc)
        if omp:
            flags.append("-fopenmp")
        return cls(cc, tuple(flags), compiler_identity(cc, native), omp)


def cache_root(cache_dir: str | os.PathLike | None) -> Path:
    if cache_dir is None:
        cache_dir = os.environ.get(CACHE_ENV) or DEFAULT_CACHE
    return Path(cache_dir).expanduser()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_key(source: str, tc: Toolchain) -> str:
    h = hashlib.sha256()
    for part in (f"opfuse-cache-{CACHE_FORMAT}", tc.identity, " ".join(tc.flags), source):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _valid_entry(entry: Path, key: str) -> bool:
    try:
        meta = json.loads((entry / META_NAME).read_text())
        return (meta.get("key") == key
                and _sha256(entry / LIBRARY_NAME) == meta.get("library_sha256")
                and _sha256(entry / SOURCE_NAME) == meta.get("source_sha256"))
    except (OSError, ValueError, AttributeError):
        return False


@dataclass(frozen=True)
class BuildResult:
    library: Path
    key: str
    cache_hit: bool
    seconds: float


def build_library(source: str, tc: Toolchain, cache_dir: str | os.PathLike | None = None) -> BuildResult:
    """Compile ``source`` into a shared library, or reuse the cached one."""
    t0 = time.perf_counter()
    key = build_key(source, tc)
    root = cache_root(cache_dir)
    entry = root / key[:2] / key
    if _valid_entry(entry, key):
        return BuildResult(entry / LIBRARY_NAME, key, True, time.perf_counter() - t0)
    if entry.exists():  # corrupt or partial: rebuild from scratch
        shutil.rmtree(entry, ignore_errors=True)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{key[:12]}-", dir=entry.parent))
    try:
        src = tmp / SOURCE_NAME
        src.write_text(source)
        so = tmp / LIBRARY_NAME
        proc = _run([tc.cc, *tc.flags, "-o", str(so), str(src), "-lm"], cwd=str(tmp))
        if proc.returncode != 0:
            errors = "\n".join(proc.stderr.splitlines()[:40])
            raise CompileError(f"{tc.cc} failed on generated code (exit {proc.returncode}):\n{errors}")
        meta = {"key": key, "cache_format": CACHE_FORMAT, "compiler": tc.identity, "flags": list(tc.flags),
                "source_sha256": _sha256(src), "library_sha256": _sha256(so)}
        (tmp / META_NAME).write_text(json.dumps(meta, indent=1, sort_keys=True))
        try:
            os.rename(tmp, entry)
        except OSError:
            # Another process finished the same build first; use theirs if it is sound.
            if not _valid_entry(entry, key):
                shutil.rmtree(entry, ignore_errors=True)
                os.rename(tmp, entry)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return BuildResult(entry / LIBRARY_NAME, key, False, time.perf_counter() - t0)
