"""Loads tfring's TensorFlow op library, `libtfring_ops.so`.

Why a loader of its own: the op library links `libtfring_core.so`, the same
core the pybind11 module `tfring._core` links. Importing `tfring._core` first
makes the dynamic loader map the core once, so the op kernels and the Python
control functions (`init`, `shutdown`, ...) share one process-wide core state.
The op library is also tied to the exact TensorFlow release it was compiled
against, so the version check runs before TensorFlow is asked to load it.
"""

import os

LIBRARY_NAME = "libtfring_ops.so"

_BUILD_HINT = (
    "Build them from the source checkout with "
    "`pip install --no-build-isolation .` (installs tfring), or "
    "`python setup.py build_ext --inplace` (builds in the checkout).")


def library_path():
    """The absolute path of the op library inside the installed package."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, LIBRARY_NAME)


def load_ops_library():
    """Returns the loaded op library module (one Python function per op).

    Raises:
      ImportError: tfring was built against a different TensorFlow release,
        or its native libraries were not built.
    """
    from tfring import _version_check

    # Raises ImportError naming both versions; returns the tensorflow module.
    tf = _version_check.check_tensorflow_version()

    path = library_path()
    if not os.path.exists(path):
        raise ImportError(
            f"tfring's native parts were not built: {path} does not exist. "
            + _BUILD_HINT)
    try:
        # Loads libtfring_core.so; the op library then binds to this copy.
        from tfring import _core  # noqa: F401
    except ImportError as e:
        raise ImportError(
            f"tfring's native parts were not built or cannot be loaded "
            f"(importing tfring._core failed: {e}). " + _BUILD_HINT) from e
    try:
        return tf.load_op_library(path)
    except tf.errors.NotFoundError as e:
        # Typically an undefined symbol: the library and the core (or
        # TensorFlow) come from different builds.
        raise ImportError(
            f"tfring's op library {path} could not be loaded: {e.message}. "
            "Rebuild tfring against the installed TensorFlow. "
            + _BUILD_HINT) from e
