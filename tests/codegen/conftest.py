import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One build cache per test session: each distinct C source compiles once."""
    return tmp_path_factory.mktemp("opfuse-cache")
