"""The system C compiler and the on-disk build cache.

A build is keyed by the SHA-256 of the C source, the compiler flags and the compiler's
identity (its version and, for ``-march=native``, the target macros it defines on this
machine), so a cache shared between machines never hands out a library built for another
CPU. An entry is a directory ``<cache>/<key[:2]>/<key>/`` holding ``model.c``,
``libmodel.so`` and ``meta.json`` with the hashes of both files; an entry whose files are
missing, truncated or do not hash to what ``meta.json`` records is deleted and rebuilt.
Entries are built in a temporary directory and renamed into place, so a crash or a
concurrent build never leaves a half-written entry under the final name. A build holds the
entry's lock (``<shard>/.lock-<key>``, ``files.file_lock``): processes compiling the same model
on a cold cache build it once; the others wait and load that entry (the same C, by the key).

Faults end in one line (``ToolchainError`` or ``StorageError``), never in a stale entry: a
compiler that cannot build a one-line library is refused before any build; a full disk or a
read-only cache is reported as such, not as a compiler failure on generated code; a file
where an entry or a shard folder should be is removed; a cache removed during a build is
recreated and the build retried once. Folders are 0700 and files 0600, and an entry owned by
another user, or writable by others, is never loaded. A build holds a lock on its temporary
folder; folders and locks left by a killed build (older than ``STALE_BUILD_S``, lock free:
the kernel drops a killed process's locks) are removed by the next build.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from opfuse.errors import OpfuseError, StorageError
from opfuse.files import CACHE_ENV, cache_dir as default_cache_dir, file_lock, private_dir, storage_error
from opfuse.progress import step

COMPILER_ENV = "CC"
COMPILE_TIMEOUT_S = 600
STALE_BUILD_S = 2 * COMPILE_TIMEOUT_S  # older than any build can be: its process is gone
BUILD_PREFIX = ".build-"
LOAD_PREFIX = ".load-"  # the loader's private copies of libraries (runtime.native)
LOCK_NAME = ".lock"
KEY_LOCK_PREFIX = ".lock-"  # one per entry being built (``files.file_lock``)
CACHE_HINT = f"set ${CACHE_ENV} to a writable folder"
# What a compiler prints when the disk, not the code, is at fault.
_STORAGE_FAILURES = ("No space left on device", "Disk quota exceeded", "Read-only file system",
                     "Permission denied")
LIBRARY_NAME = "libmodel.so"
SOURCE_NAME = "model.c"
META_NAME = "meta.json"
CACHE_FORMAT = 1
# -ffp-contract=off: the compiler fuses no multiply-add on its own; the code asks for one where it
# wants it (the micro-kernels' FMA intrinsics, vecmath's OPFUSE_FMAF), behind the target's FMA
# macros and never in the plain C99 build (simd="none"), whose results then depend on no FMA unit.
# -fno-math-errno: libm calls never set errno (lets sqrtf inline); no effect on values.
# -fno-trapping-math: floating-point exceptions never trap (they do not: nothing enables them),
# so gcc may compute both arms of a ternary and select (the vectorised exp, log, tanh...); no
# effect on values.
# -fwrapv: signed integer arithmetic wraps (two's complement), as in NumPy, the reference and ONNX
# runtimes; without it an overflow is undefined and gcc drops checks that depend on it (Relu of
# INT_MAX + 1 came out INT_MIN). No loop lost its vectorisation (the zoo's reports compared).
BASE_FLAGS = ("-O3", "-std=c99", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
              "-fwrapv")
FAST_MATH_FLAGS = ("-ffast-math", "-ffp-contract=fast")


class ToolchainError(OpfuseError):
    """No usable C compiler: the native backend cannot run here."""


class CompileError(RuntimeError):
    """The C compiler rejected generated code (a bug in opfuse, so not an OpfuseError)."""


def find_compiler() -> str:
    """``$CC`` if set (a command line such as ``ccache gcc``), else the first of cc, gcc, clang on
    PATH; its program resolved on PATH. ``ToolchainError`` if none."""
    env = os.environ.get(COMPILER_ENV, "").strip()
    try:
        candidates = [shlex.split(env)] if env else [["cc"], ["gcc"], ["clang"]]
    except ValueError as e:
        raise ToolchainError(f"$CC={env!r} is not a command line: {e}") from None
    for argv in candidates:
        path = shutil.which(argv[0]) if argv else None
        if path:
            return shlex.join([path, *argv[1:]])
    raise ToolchainError("no C compiler found (looked for " + ", ".join(shlex.join(c) for c in candidates) + "); "
                         "install gcc or clang, or set $CC, or run with the reference backend (--backend reference)")


def _argv(cc: str) -> list[str]:
    return shlex.split(cc)


def _run(cmd: list[str], cwd: str | None = None, timeout: float = COMPILE_TIMEOUT_S) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False,
                              errors="replace")
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"the C compiler ran for more than {timeout:.0f} s: {shlex.join(cmd[:1])}") from None
    except OSError as e:
        raise ToolchainError(f"cannot run the C compiler '{cmd[0]}': {e.strerror or e}") from None


def _first_lines(text: str, n: int = 1) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[:n])


@functools.lru_cache(maxsize=None)
def check_compiler(cc: str) -> None:
    """Build a one-line shared library with ``cc``: a compiler that fails, or exits 0 without
    writing the library, is a ``ToolchainError`` here, not a "failure on generated code" later."""
    try:
        d = tempfile.mkdtemp(prefix="opfuse-cc-")
    except OSError as e:
        raise storage_error(e, "create a folder in", tempfile.gettempdir(), "needed to test the C compiler") from None
    try:
        src, so = Path(d, "probe.c"), Path(d, "probe.so")
        try:
            src.write_text("int opfuse_probe(void) { return 42; }\n")
        except OSError as e:
            raise storage_error(e, "write", src, "needed to test the C compiler") from None
        proc = _run([*_argv(cc), "-fPIC", "-shared", "-o", str(so), str(src)], cwd=d)
        if proc.returncode != 0:
            for cause in _STORAGE_FAILURES:
                if cause in proc.stderr:
                    raise StorageError(f"the C compiler '{cc}' cannot write its files: {cause} (in "
                                       f"{tempfile.gettempdir()} or $TMPDIR)")
            why = _first_lines(proc.stderr or proc.stdout, 2)
            raise ToolchainError(f"the C compiler '{cc}' does not work: it failed (exit {proc.returncode}) on a "
                                 f"one-line library{': ' + why if why else ''}; fix $CC, or run with the "
                                 f"reference backend (--backend reference)")
        if not so.is_file() or so.stat().st_size == 0:
            raise ToolchainError(f"the C compiler '{cc}' does not work: it exited 0 but wrote no library; fix $CC, "
                                 f"or run with the reference backend (--backend reference)")
    finally:
        shutil.rmtree(d, ignore_errors=True)


# Where ``-march=native`` has AVX-512, the compiler's own vectorised loops run 256 bits wide (the generated C's
# zmm intrinsics keep their width): GCC 12.2's default for Zen 4 is 512, and its 512-bit loop vectorizer
# miscompiled a fused int64 Concat whose if-converted loads fed three chains (zeros for half the rows; the C
# is right, -O2 and 256 bits are too: tests/e2e/repro/gcc12_avx512_concat_select). GCC's default for
# Intel's AVX-512 cores is 256 already. Measured on the Zen 4 host (whole models, 1 thread, medians of 6
# interleaved rounds of 20, the same outputs): bert_layer 1.008x, mobilenet_v1 1.001x, yolo_block 0.97x,
# resnet18 0.99x: noise. The same branch miscompiled with AVX2 as well (fuzz seed 41214), so the code generator
# no longer writes a branch between a Concat's loads (``codegen/loops.py``, ``rules._concat``).
AVX512_VECTOR_WIDTH_FLAGS = ("-mprefer-vector-width=256",)


@functools.lru_cache(maxsize=None)
def _native_macros(cc: str) -> str:
    """The macros ``cc -march=native`` defines here (its target's features)."""
    return _run([*_argv(cc), "-march=native", "-dM", "-E", "-x", "c", os.devnull]).stdout


def native_avx512(cc: str) -> bool:
    """Whether ``cc -march=native`` targets AVX-512 here (``__AVX512F__`` defined)."""
    return "#define __AVX512F__ 1" in _native_macros(cc)


@functools.lru_cache(maxsize=None)
def compiler_identity(cc: str, native: bool) -> str:
    """Version line of ``cc`` plus a hash of the macros ``-march=native`` defines here."""
    ver = _run([*_argv(cc), "--version"]).stdout.splitlines()
    ident = ver[0] if ver else cc
    if native:
        ident += " native:" + hashlib.sha256(_native_macros(cc).encode()).hexdigest()[:16]
    return ident


# The flags of a threaded build: POSIX threads for the program's own pool (codegen/threadpool.py).
THREAD_FLAGS = ("-pthread", "-DOPFUSE_THREADS")
# Undefined behaviour in the generated C made an error at run time (``Toolchain.detect(sanitize=True)``;
# the fuzzer's ``ubsan`` profile): UBSan's checks, and float-to-integer conversions out of range (not in
# ``undefined``: a fused QuantizeLinear's ``(uint8_t)NaN`` was one), each ending the process with its
# message rather than printing it and going on.
SANITIZE_FLAGS = ("-fsanitize=undefined,float-cast-overflow", "-fno-sanitize-recover=all")


# Strict C (``OPFUSE_STRICT_C=1``; the test suite sets it, tests/conftest.py): the warnings that mean the code
# generator wrote C it did not mean made errors, with GCC. A stored value written through a pointer the kernel
# declared ``const`` (a discarded qualifier), a call of an undeclared function, a pointer passed as another type
# or as an integer: each compiles, with a warning, to code that may run right today, so only the error shows
# it. Users' builds keep them warnings: such a slip is a bug to report, not a build to refuse.
STRICT_ENV = "OPFUSE_STRICT_C"
STRICT_FLAGS = ("-Werror=discarded-qualifiers", "-Werror=implicit-function-declaration",
                "-Werror=incompatible-pointer-types", "-Werror=int-conversion")


def strict_c() -> bool:
    """Whether builds treat ``STRICT_FLAGS``' warnings as errors (``OPFUSE_STRICT_C=1``)."""
    return os.environ.get(STRICT_ENV, "0").strip() == "1"


@functools.lru_cache(maxsize=None)
def supports_threads(cc: str) -> bool:
    """Whether ``cc`` builds a shared library that starts a POSIX thread (``THREAD_FLAGS``)."""
    with tempfile.TemporaryDirectory(prefix="opfuse-threads-") as d:
        src = Path(d, "t.c")
        src.write_text("#include <pthread.h>\nstatic void* g(void* p) { return p; }\n"
                       "int f(void) { pthread_t t; return pthread_create(&t, 0, g, 0) || pthread_join(t, 0); }\n")
        return _run([*_argv(cc), *THREAD_FLAGS, "-fPIC", "-shared", "-o", str(Path(d, "t.so")),
                     str(src)]).returncode == 0


@functools.lru_cache(maxsize=None)
def supports_sanitizer(cc: str) -> bool:
    """Whether ``cc`` builds a shared library with ``SANITIZE_FLAGS`` (its runtime, libubsan, installed)."""
    with tempfile.TemporaryDirectory(prefix="opfuse-ubsan-") as d:
        src = Path(d, "u.c")
        src.write_text("int f(int a, float x) { return a << 3 ^ (int)x; }\n")
        return _run([*_argv(cc), *SANITIZE_FLAGS, "-fPIC", "-shared", "-o", str(Path(d, "u.so")),
                     str(src)]).returncode == 0


@dataclass(frozen=True)
class Toolchain:
    cc: str
    flags: tuple[str, ...]
    identity: str
    threads: bool  # the build runs the parallel loops on the pool's threads (else inline, on one)

    @classmethod
    def detect(cls, *, native: bool = True, fast_math: bool = False, threads: bool = True,
               sanitize: bool = False) -> "Toolchain":
        """``sanitize``: with ``SANITIZE_FLAGS`` (``ToolchainError`` where the compiler cannot)."""
        cc = find_compiler()
        check_compiler(cc)
        flags = list(BASE_FLAGS)
        if strict_c() and is_gcc(cc):
            flags.extend(STRICT_FLAGS)
        if sanitize:
            if not supports_sanitizer(cc):
                raise ToolchainError(f"the C compiler '{cc}' cannot build with {' '.join(SANITIZE_FLAGS)} (is "
                                     f"libubsan installed?)")
            flags.extend(SANITIZE_FLAGS)
        if native:
            flags.append("-march=native")
            if native_avx512(cc):
                flags.extend(AVX512_VECTOR_WIDTH_FLAGS)
        if fast_math:
            flags = [f for f in flags if f != "-ffp-contract=off"] + list(FAST_MATH_FLAGS)
        pool = threads and supports_threads(cc)
        if pool:
            flags.extend(THREAD_FLAGS)
        return cls(cc, tuple(flags), compiler_identity(cc, native), pool)


def cache_root(cache_dir: str | os.PathLike | None) -> Path:
    """``cache_dir`` (``~`` expanded), else ``opfuse.files.cache_dir()``, shared with the host profile."""
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


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


def _trusted(path: Path) -> bool:
    """Owned by this user and writable by no one else: another user could have planted it."""
    st = path.lstat()
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def _valid_entry(entry: Path, key: str) -> bool:
    try:
        meta = json.loads((entry / META_NAME).read_text())
        return (_trusted(entry) and _trusted(entry / LIBRARY_NAME)
                and meta.get("key") == key
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


class _CacheRemoved(Exception):
    """The build folder vanished under a running build (the cache was deleted): build again."""


def _remove(path: Path) -> None:
    """Delete what is at ``path`` inside the cache (a folder, a file, a link)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if path.exists() or path.is_symlink():
        raise StorageError(f"cannot replace '{path}' in the build cache (another user's, or read-only); "
                           f"{CACHE_HINT}")


def _cache_folder(path: Path) -> Path:
    """``path`` as a 0700 folder of the cache; a plain file or a link in its way is removed."""
    if (path.exists() or path.is_symlink()) and (path.is_symlink() or not path.is_dir()):
        _remove(path)
    return private_dir(path, "build cache")


def _unlocked(lock_file: Path) -> bool:
    """True when no running process holds ``lock_file``'s lock (a killed one's is released)."""
    try:
        with open(lock_file, "a") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
    except FileNotFoundError:
        return True  # the folder is gone, or was never locked
    except OSError:
        return False


def remove_stale_builds(root: Path, max_age_s: float = STALE_BUILD_S) -> list[Path]:
    """Delete the temporary folders, library copies and entry locks left under ``root`` by
    killed processes: older than ``max_age_s`` and, for build folders and locks, not locked by
    a live process. Returns what was removed."""
    now = time.time()
    removed: list[Path] = []

    def old(p: os.DirEntry) -> bool:
        try:
            return now - p.stat(follow_symlinks=False).st_mtime > max_age_s
        except OSError:
            return False

    shards: list[str] = []
    with contextlib.suppress(OSError), os.scandir(root) as top:
        shards = [e.path for e in top if len(e.name) == 2 and e.is_dir(follow_symlinks=False)]
    for shard in shards:
        with contextlib.suppress(OSError), os.scandir(shard) as it:
            for e in it:
                if not old(e):
                    continue
                load_copy = e.name.startswith(LOAD_PREFIX) and e.name.endswith(".so")
                key_lock = e.name.startswith(KEY_LOCK_PREFIX) and _unlocked(Path(e.path))
                if (load_copy or key_lock) and e.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)
                        removed.append(Path(e.path))
                elif (e.name.startswith(BUILD_PREFIX) and e.is_dir(follow_symlinks=False)
                      and _unlocked(Path(e.path) / LOCK_NAME)):
                    shutil.rmtree(e.path, ignore_errors=True)
                    removed.append(Path(e.path))
    return removed


def _compiler_failure(proc: subprocess.CompletedProcess, tc: Toolchain, tmp: Path) -> Exception:
    """Why the compiler failed: the cache vanished, the disk, a signal, or (a bug) the code."""
    if not tmp.is_dir():
        return _CacheRemoved()
    for cause in _STORAGE_FAILURES:
        if cause in proc.stderr:
            return StorageError(f"cannot write the build cache '{tmp.parent.parent}': {cause} (the C compiler "
                                f"failed writing its output); {CACHE_HINT}")
    if proc.returncode < 0:
        return ToolchainError(f"the C compiler '{tc.cc}' was killed by signal {-proc.returncode}")
    errors = "\n".join(proc.stderr.splitlines()[:40])
    return CompileError(f"{tc.cc} failed on generated code (exit {proc.returncode}):\n{errors}")


# Precompiled system headers. A host program begins with its block of system headers (``CProgram.prelude``),
# and with gcc -O3 -march=native immintrin.h alone took 0.5 s of a 1.0 s compile; parsed once into a
# precompiled header (``<cache>/pch/<key>/prelude.h.gch``, keyed by the compiler's identity, its flags and the
# block), each build ``-include``s it, and the source's own includes of those headers are no-ops behind their
# guards: the same library, byte for byte (tests/runtime/test_pch.py), in 0.36 s. GCC only (clang names the
# file otherwise); ``$OPFUSE_PCH=0`` turns it off. A precompiled header gcc cannot use (another compiler
# build, a changed flag) is ignored by gcc, which reads the header itself; a build that fails with one is
# retried without it, and the header removed. ``$OPFUSE_PCH_DIR`` puts the headers in one folder for every cache
# (the test suite's many small caches share one, 26 MB each otherwise).
PCH_ENV = "OPFUSE_PCH"
PCH_DIR_ENV = "OPFUSE_PCH_DIR"
PCH_FOLDER = "pch"
PCH_HEADER = "prelude.h"


@functools.lru_cache(maxsize=None)
def is_gcc(cc: str) -> bool:
    """Whether ``cc`` is GCC itself (``__GNUC__`` without clang's or Intel's macros): its .gch files."""
    macros = _run([*_argv(cc), "-dM", "-E", "-x", "c", os.devnull]).stdout
    return "#define __GNUC__ " in macros and "__clang__" not in macros and "__INTEL" not in macros


def _pch_flags(tc: Toolchain) -> list[str]:
    """The flags of the precompiled header: the build's, without the link's ``-shared``."""
    return [f for f in tc.flags if f != "-shared"]


def precompiled_prelude(root: Path, tc: Toolchain, prelude: str) -> list[str]:
    """``["-include", header]`` of ``prelude`` precompiled for ``tc`` under ``root/pch`` or ``$OPFUSE_PCH_DIR``
    (built once, under a lock, renamed into place), or ``[]`` where there is nothing to precompile, it is turned
    off, ``tc`` is not GCC, or the header cannot be built or trusted (the build then parses the headers itself)."""
    if not prelude or os.environ.get(PCH_ENV, "1").strip() == "0" or not is_gcc(tc.cc):
        return []
    h = hashlib.sha256()
    for part in (f"opfuse-pch-{CACHE_FORMAT}", tc.identity, " ".join(tc.flags), prelude):
        h.update(part.encode())
        h.update(b"\0")
    try:
        shared = os.environ.get(PCH_DIR_ENV, "").strip()
        base = Path(shared).expanduser() if shared else root / PCH_FOLDER
        folder = _cache_folder(private_dir(base, "build cache") / h.hexdigest()[:32])
        header, gch = folder / PCH_HEADER, folder / (PCH_HEADER + ".gch")
        with file_lock(folder.parent / f"{KEY_LOCK_PREFIX}{folder.name}"):
            for left in folder.glob(f"{BUILD_PREFIX}*"):  # a killed build's (the lock is ours)
                left.unlink()
            if not (_sound_pch(gch) and header.is_file() and _trusted(header) and header.read_text() == prelude):
                _build_pch(folder, tc, prelude)
        return ["-include", str(header)] if _trusted(folder) else []
    except (OSError, StorageError, ToolchainError):
        return []


def _stamp(st: os.stat_result) -> str:
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ino}"


def _sound_pch(gch: Path) -> bool:
    """The .gch is the file ``_build_pch`` renamed into place (its size, time and inode in its stamp file), this
    user's: gcc silently reads the headers themselves past a damaged one, so damage would only be slowness."""
    try:
        stamp = Path(str(gch) + ".stamp")
        return _trusted(gch) and _trusted(stamp) and stamp.read_text() == _stamp(gch.stat())
    except OSError:
        return False


def _build_pch(folder: Path, tc: Toolchain, prelude: str) -> None:
    """Write ``prelude`` and its .gch into ``folder`` by temporary names renamed into place."""
    header, gch = folder / PCH_HEADER, folder / (PCH_HEADER + ".gch")
    fd, tmp_name = tempfile.mkstemp(prefix=BUILD_PREFIX, suffix=".h", dir=folder)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(prelude)
        proc = _run([*_argv(tc.cc), *_pch_flags(tc), "-x", "c-header", "-o", str(tmp) + ".gch", str(tmp)],
                    cwd=str(folder))
        if proc.returncode != 0 or not Path(str(tmp) + ".gch").is_file():
            raise ToolchainError(f"no precompiled header: {_first_lines(proc.stderr)}")
        os.chmod(str(tmp) + ".gch", 0o600)
        os.replace(str(tmp) + ".gch", gch)  # the .gch first: a header without one is only slower
        os.replace(tmp, header)
        stamp = Path(str(tmp) + ".stamp")
        stamp.write_text(_stamp(gch.stat()))
        stamp.chmod(0o600)
        os.replace(stamp, str(gch) + ".stamp")
    finally:
        for left in (Path(str(tmp) + ".gch"), Path(str(tmp) + ".stamp"), tmp):
            with contextlib.suppress(FileNotFoundError):
                left.unlink()


def _build_entry(source: str, tc: Toolchain, key: str, entry: Path, pch: list[str] | None = None) -> None:
    """Compile into a locked temporary folder of the shard and rename it to ``entry``."""
    private_dir(entry.parent.parent, "build cache")  # never removes what is there: it is the user's path
    shard = _cache_folder(entry.parent)
    if entry.exists() or entry.is_symlink():  # corrupt, partial, foreign, or a file: rebuild from scratch
        _remove(entry)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f"{BUILD_PREFIX}{key[:12]}-", dir=shard))
    except FileNotFoundError:
        raise _CacheRemoved() from None
    except OSError as e:
        raise storage_error(e, "write the build cache", shard, CACHE_HINT) from None
    lock = None
    try:
        lock = open(tmp / LOCK_NAME, "w")
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        src = tmp / SOURCE_NAME
        src.write_text(source)
        so = tmp / LIBRARY_NAME
        try:
            proc = _run([*_argv(tc.cc), *tc.flags, *(pch or []), "-o", str(so), str(src), "-lm"], cwd=str(tmp))
            if proc.returncode != 0 and pch and tmp.is_dir():  # again without the precompiled header
                proc = _run([*_argv(tc.cc), *tc.flags, "-o", str(so), str(src), "-lm"], cwd=str(tmp))
                if proc.returncode == 0:  # it was the header's fault (damaged): the next build makes another
                    shutil.rmtree(Path(pch[-1]).parent, ignore_errors=True)
        except ToolchainError:
            if not tmp.is_dir():
                raise _CacheRemoved() from None
            raise
        if proc.returncode != 0:
            raise _compiler_failure(proc, tc, tmp)
        if not so.is_file() or so.stat().st_size == 0:
            raise ToolchainError(f"the C compiler '{tc.cc}' exited 0 but wrote no library")
        meta = {"key": key, "cache_format": CACHE_FORMAT, "compiler": tc.identity, "flags": list(tc.flags),
                "source_sha256": _sha256(src), "library_sha256": _sha256(so)}
        (tmp / META_NAME).write_text(json.dumps(meta, indent=1, sort_keys=True))
        for f in (src, so, tmp / META_NAME):
            f.chmod(0o600)
        (tmp / LOCK_NAME).unlink()
        try:
            os.rename(tmp, entry)
        except OSError:
            # Another process finished the same build first; use theirs if it is sound.
            if not _valid_entry(entry, key):
                _remove(entry)
                os.rename(tmp, entry)
    except OSError as e:
        if isinstance(e, FileNotFoundError) and not tmp.is_dir():
            raise _CacheRemoved() from None
        raise storage_error(e, "write the build cache", shard, CACHE_HINT) from None
    finally:
        if lock is not None:
            lock.close()
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def build_library(source: str, tc: Toolchain, cache_dir: str | os.PathLike | None = None,
                  prelude: str = "") -> BuildResult:
    """Compile ``source`` into a shared library, or reuse the cached one. ``prelude``: the block of system
    headers ``source`` begins with (after comments), precompiled once per cache (``precompiled_prelude``)."""
    t0 = time.perf_counter()
    key = build_key(source, tc)
    root = cache_root(cache_dir)
    entry = root / key[:2] / key
    if _valid_entry(entry, key):
        return BuildResult(entry / LIBRARY_NAME, key, True, time.perf_counter() - t0)
    # One build per key at a time: a process that waited here finds the entry the other built.
    with _key_lock(root, key):
        if _valid_entry(entry, key):
            return BuildResult(entry / LIBRARY_NAME, key, True, time.perf_counter() - t0)
        remove_stale_builds(root)
        with step(f"compiling C ({len(source) // 1024} KiB of source)"):
            pch = precompiled_prelude(root, tc, prelude) if prelude and _begins_with(source, prelude) else []
            for attempt in (1, 2):
                try:
                    _build_entry(source, tc, key, entry, pch)
                    break
                except _CacheRemoved:
                    if attempt == 2:
                        raise StorageError(f"the build cache '{root}' was removed during the build, twice") from None
    return BuildResult(entry / LIBRARY_NAME, key, False, time.perf_counter() - t0)


def _begins_with(source: str, prelude: str) -> bool:
    """Whether ``source`` is comment lines, blank lines, then ``prelude``: nothing before it that the headers
    could see."""
    at = source.find(prelude)
    if at < 0:
        return False
    head = re.sub(r"/\*.*?\*/", "", source[:at], flags=re.S)
    return head.strip() == ""


def _key_lock(root: Path, key: str) -> contextlib.AbstractContextManager[bool]:
    """The lock of ``key``'s entry (``<shard>/.lock-<key>``, removed on release); none where the
    shard cannot be made (the build then reports why)."""
    try:
        private_dir(root, "build cache")
        shard = _cache_folder(root / key[:2])
    except StorageError:
        return contextlib.nullcontext(False)
    return file_lock(shard / f"{KEY_LOCK_PREFIX}{key}")
