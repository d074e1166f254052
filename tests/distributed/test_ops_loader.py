# tfring.ops.loader: the TensorFlow version check runs first, a missing op
# library is an ImportError that says how to build it, and loading again is
# harmless. Local to each rank; no collectives.

import os

import pytest

from tfring import _build_info
from tfring.ops import loader


def test_library_sits_next_to_the_loader():
    assert loader.library_path() == os.path.join(
        os.path.dirname(os.path.abspath(loader.__file__)), "libtfring_ops.so")
    assert os.path.exists(loader.library_path())


def test_loading_again_returns_the_same_ops():
    library = loader.load_ops_library()
    assert callable(library.tfring_allreduce)
    assert callable(library.tfring_local_rank)


def test_missing_library_says_how_to_build(monkeypatch, tmp_path):
    missing = str(tmp_path / "libtfring_ops.so")
    monkeypatch.setattr(loader, "library_path", lambda: missing)
    with pytest.raises(ImportError) as info:
        loader.load_ops_library()
    message = str(info.value)
    assert "tfring's native parts were not built" in message
    assert missing in message
    assert "pip install --no-build-isolation ." in message
    assert "python setup.py build_ext --inplace" in message


def test_other_tensorflow_version_is_refused_before_loading(monkeypatch):
    import tensorflow as tf
    monkeypatch.setattr(_build_info, "TF_VERSION", "0.0.1")
    monkeypatch.setattr(loader, "library_path",
                        lambda: pytest.fail("loaded despite the mismatch"))
    with pytest.raises(ImportError) as info:
        loader.load_ops_library()
    assert "0.0.1" in str(info.value)
    assert tf.__version__ in str(info.value)
