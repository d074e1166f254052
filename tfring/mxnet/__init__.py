# tfring.mxnet: horovod.mxnet's API over tfring's core, so that an MXNet
# (Gluon or Module) script written for Horovod runs after changing its import
# to `import tfring.mxnet as hvd`. Nothing in it is compiled against MXNet:
# NDArrays reach the core through their CPU memory (see ndarrays.py), so one
# tfring build serves MXNet as installed. This file only checks that MXNet
# is there and re-exports.

try:
    import mxnet as _mx
except ImportError as _error:
    raise ImportError(
        "tfring.mxnet needs Apache MXNet, which is not importable in this "
        f"Python environment ({_error}). tfring itself does not depend on it. "
        "MXNet 1.9.1, its last release, needs NumPy < 1.24, which TensorFlow "
        "2.21 cannot share, so install it in an environment of its own: "
        "`python3 -m venv .venv-mxnet && .venv-mxnet/bin/pip install "
        "mxnet==1.9.1 \"numpy<1.24\"` and tfring into it (tools/install.sh "
        "does both), then import tfring.mxnet from that environment's Python."
    ) from _error

from tfring._version import __version__  # noqa: E402,F401
from tfring.mxnet.mpi_ops import *  # noqa: E402,F401,F403
from tfring.mxnet.mpi_ops import init, shutdown  # noqa: E402,F401
from tfring.mxnet.compression import Compression  # noqa: E402,F401
from tfring.common.errors import (  # noqa: E402,F401
    HorovodInternalError,
    HostsUpdatedInterrupt,
)
from tfring.mxnet.functions import (  # noqa: E402,F401
    allgather_object,
    broadcast_object,
    broadcast_parameters,
)
from tfring.mxnet.optimizer import DistributedOptimizer  # noqa: E402,F401
from tfring.mxnet.trainer import DistributedTrainer  # noqa: E402,F401
