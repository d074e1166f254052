# tfring.torch: horovod.torch's API over tfring's core, so that a PyTorch
# script written for Horovod runs after changing its import to
# `import tfring.torch as hvd`. Nothing in it is compiled against torch:
# tensors reach the core through their CPU memory (see collectives.py), so
# one tfring build serves every torch release from 2.1 on. This file only
# checks that torch is there and re-exports.

try:
    import torch as _torch
except ImportError as _error:
    raise ImportError(
        "tfring.torch needs PyTorch, which is not installed in this Python "
        f"environment ({_error}). tfring itself does not depend on it. "
        "Install it with `pip install torch` (CPU-only wheels: `pip install "
        "torch --index-url https://download.pytorch.org/whl/cpu`), then import "
        "tfring.torch again.") from _error

if not hasattr(_torch.Tensor, "register_post_accumulate_grad_hook"):
    raise ImportError(
        f"tfring.torch needs torch 2.1 or later; this environment has torch "
        f"{_torch.__version__}. Upgrade it with `pip install -U torch`.")

from tfring._version import __version__  # noqa: E402,F401
from tfring.torch.mpi_ops import *  # noqa: E402,F401,F403
from tfring.torch.mpi_ops import init, shutdown  # noqa: E402,F401
# The function, not the submodule of the same name.
from tfring.torch.join import join  # noqa: E402,F401
from tfring.torch.compression import Compression  # noqa: E402,F401
from tfring.torch.errors import (  # noqa: E402,F401
    HorovodInternalError,
    HostsUpdatedInterrupt,
)
from tfring.torch.functions import (  # noqa: E402,F401
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from tfring.torch.optimizer import DistributedOptimizer  # noqa: E402,F401
from tfring.torch.powersgd import PowerSGD  # noqa: E402,F401
from tfring.torch.sync_batch_norm import SyncBatchNorm  # noqa: E402,F401
from tfring.process_sets import (  # noqa: E402,F401
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from tfring.torch import elastic  # noqa: E402,F401  (hvd.elastic.run)
