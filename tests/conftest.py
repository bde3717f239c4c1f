"""Shared test configuration: a per-session build cache so tests never touch ~/.cache."""
import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _opfuse_cache_dir(tmp_path_factory):
    if "OPFUSE_CACHE_DIR" not in os.environ:
        os.environ["OPFUSE_CACHE_DIR"] = str(tmp_path_factory.mktemp("opfuse-cache"))
    yield
