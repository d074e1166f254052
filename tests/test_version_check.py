"""tfring._version_check: the op library refuses a TensorFlow it was not built for."""

import sys

import pytest

from tfring import _build_info, _version_check

REINSTALL = "pip install --no-build-isolation --force-reinstall --no-deps --no-cache-dir"


def test_matching_version_passes():
    tf = _version_check.check_tensorflow_version()
    assert tf.__version__ == _build_info.TF_VERSION


def test_mismatch_names_both_versions_and_the_fix(monkeypatch):
    import tensorflow as tf
    monkeypatch.setattr(_build_info, "TF_VERSION", "2.0.0")
    with pytest.raises(ImportError) as raised:
        _version_check.check_tensorflow_version()
    message = str(raised.value)
    assert "built against TensorFlow 2.0.0" in message
    assert f"TensorFlow {tf.__version__} is installed" in message
    assert REINSTALL in message


def test_missing_tensorflow_is_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # makes `import tensorflow` fail
    with pytest.raises(ImportError) as raised:
        _version_check.check_tensorflow_version()
    message = str(raised.value)
    assert "tfring needs TensorFlow" in message
    assert f"TensorFlow {_build_info.TF_VERSION}" in message
    assert REINSTALL in message


def test_build_info_fields():
    assert isinstance(_build_info.TF_VERSION, str) and _build_info.TF_VERSION
    assert _build_info.MPI_COMPILER.endswith(("mpicxx", "mpic++", "mpiCC"))
    assert _build_info.NCCL_BUILT is False
