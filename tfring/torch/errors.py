# horovod.torch's exception names; they live in tfring.common.errors, shared
# with tfring.mxnet, so that one `except` clause catches either front end's.

from tfring.common.errors import (  # noqa: F401
    HorovodInternalError,
    HostsUpdatedInterrupt,
    InvalidArgumentError,
)
