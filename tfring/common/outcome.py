# The outcome of a buffer collective: the core's PendingCollectives (one per
# tensor) waited for, and their first failure raised as the exception the
# front ends document.
#
# Why shared: tfring.torch's handles and tfring.mxnet's synchronous calls
# both end a collective this way; one place decides which core status
# becomes which exception.

from tfring import _core
from tfring.common.errors import HorovodInternalError, InvalidArgumentError


def wait_all(pending):
    """Waits (without the GIL) for every PendingCollective of `pending`;
    raises InvalidArgumentError or HorovodInternalError with the first
    failure once all have completed."""
    failure = None
    for one in pending:
        code, message = one.wait()
        if code != _core.StatusCode.OK and failure is None:
            failure = (code, message)
    if failure is not None:
        code, message = failure
        if code == _core.StatusCode.InvalidArgument:
            raise InvalidArgumentError(message)
        raise HorovodInternalError(message)


def enqueue(collective_type, name, dtype, shape, address, **fields):
    """One buffer to the core; the PendingCollective. A refusal of the
    core's own (not an argument it validates: those stay ValueError)
    becomes HorovodInternalError."""
    try:
        return _core.enqueue(collective_type, name, dtype, list(shape), address, **fields)
    except RuntimeError as e:
        raise HorovodInternalError(str(e)) from None
