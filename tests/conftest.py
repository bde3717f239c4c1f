"""Shared test configuration: one build cache per test run so tests never touch ~/.cache.

Under pytest-xdist (`make test` runs `-n auto --dist loadfile`) every worker gets its own base temp
folder; the cache lives in their common parent so a model compiled by one worker is a cache hit for
the others (the build cache is safe for concurrent writers: tests/runtime covers that).
"""
import os
from pathlib import Path

import pytest

# The suite's graphs are small: with the production thread gates (``CodegenOptions.thread_gates``) their
# kernels and inferences would run on one thread at any thread count, and no test that runs on two would see
# the threaded code. Tests of the gates set ``thread_gates=True``; ``OPFUSE_THREAD_GATES=1 make test`` runs
# the whole suite with them.
os.environ.setdefault("OPFUSE_THREAD_GATES", "0")
# Every C build of the suite in strict C (``runtime.toolchain.STRICT_FLAGS``): a discarded const qualifier, an
# undeclared function or a mistyped pointer in the generated C fails the test that built it.
os.environ.setdefault("OPFUSE_STRICT_C", "1")


@pytest.fixture(scope="session", autouse=True)
def _opfuse_cache_dir(tmp_path_factory, worker_id):
    if "OPFUSE_CACHE_DIR" not in os.environ:
        if worker_id == "master":
            cache = tmp_path_factory.mktemp("opfuse-cache")
        else:
            cache = tmp_path_factory.getbasetemp().parent / "opfuse-cache"
            cache.mkdir(exist_ok=True)
        os.environ["OPFUSE_CACHE_DIR"] = str(cache)
    # one folder of precompiled system headers for every cache the tests make (26 MB each otherwise)
    os.environ.setdefault("OPFUSE_PCH_DIR", str(Path(os.environ["OPFUSE_CACHE_DIR"]) / "pch"))
    yield
