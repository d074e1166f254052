"""Checks that the running TensorFlow is the one tfring's op library was built against.

libtfring_ops.so is compiled against TensorFlow's C++ headers and links
libtensorflow_framework.so.2, whose ABI changes between releases. Loading it
into a different TensorFlow fails with an obscure 'undefined symbol' error or,
worse, misbehaves, so tfring.ops calls check_tensorflow_version() first.
setup.py records the build-time version in tfring/_build_info.py.
"""

import os

__all__ = ["check_tensorflow_version"]


def _reinstall_command():
    """The pip command that rebuilds tfring against the installed TensorFlow."""
    target = "tfring"
    try:
        from tfring import _build_info
        source = getattr(_build_info, "SOURCE_DIR", None)
        if source and os.path.isfile(os.path.join(source, "setup.py")):
            target = source
    except ImportError:
        pass
    return ("pip install --no-build-isolation --force-reinstall --no-deps "
            "--no-cache-dir " + target)


def check_tensorflow_version():
    """Raises ImportError unless TensorFlow imports and matches the build-time version.

    Returns the imported tensorflow module.
    """
    try:
        import tensorflow
    except ImportError as e:
        built = _built_version()
        install = (f"Install TensorFlow {built}, the release tfring was built against "
                   f"(`pip install tensorflow=={built}`, or tensorflow-cpu or "
                   f"tensorflow[and-cuda] at that version), or install any TensorFlow "
                   f"and rebuild tfring against it:" if built else
                   "Install TensorFlow (`pip install tensorflow`, or tensorflow-cpu or "
                   "tensorflow[and-cuda]), then build tfring against it:")
        raise ImportError(
            f"tfring needs TensorFlow, but importing it failed: {e}.\n{install}\n"
            f"    {_reinstall_command()}") from e

    try:
        from tfring import _build_info
    except ImportError as e:
        raise ImportError(
            "tfring's native libraries have not been built in this tree "
            "(tfring/_build_info.py is missing; setup.py writes it). Build them with "
            "`python setup.py build_ext --inplace` or install tfring with "
            "`pip install --no-build-isolation .`") from e

    running = tensorflow.__version__
    if running != _build_info.TF_VERSION:
        raise ImportError(
            f"tfring was built against TensorFlow {_build_info.TF_VERSION}, but "
            f"TensorFlow {running} is installed now. The op library is only "
            f"compatible with the TensorFlow it was compiled against. Rebuild tfring "
            f"against the installed TensorFlow:\n    {_reinstall_command()}\n"
            f"or reinstall TensorFlow {_build_info.TF_VERSION}.")
    return tensorflow


def _built_version():
    try:
        from tfring import _build_info
        return _build_info.TF_VERSION
    except ImportError:
        return None
