# Exceptions and message helpers shared by the Python front end.
#
# Why a module of its own: every public function validates its arguments
# before anything reaches C++, and those messages must read alike: what
# happened (with the values), what was expected, how to fix it. Errors that
# the core reports while a collective runs (a cross-rank mismatch, a shutdown,
# a dead peer) arrive as TensorFlow errors (tf.errors.FailedPreconditionError,
# tf.errors.AbortedError) and are not wrapped here.


class UnsupportedOperationError(NotImplementedError, ValueError):
    """A Horovod feature that tfring does not implement (for example Adasum).

    Derives from NotImplementedError (what Horovod raises for a feature it
    lacks) and from ValueError (what tfring raises for a bad argument), so
    either `except` clause catches it.
    """


def not_initialized(api_name, was_shut_down=False):
    """The ValueError for `api_name` used before init() or after shutdown()."""
    if was_shut_down:
        return ValueError(
            f"tfring has been shut down: `{api_name}` was called after "
            "`tfring.shutdown()`. tfring must be initialized for this call. "
            "Call `tfring.init()` again first, or make this call before "
            "`tfring.shutdown()`.")
    return ValueError(
        f"tfring has not been initialized; call tfring.init() first. "
        f"`{api_name}` was called before `tfring.init()`. Call "
        "`tfring.init()` once at the start of the program, before any other "
        "tfring function (with `import tfring as hvd`: `hvd.init()`).")
