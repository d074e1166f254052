# Elastic training for PyTorch: Horovod's horovod.torch.elastic over
# tfring's elastic run loop (tfring/elastic/).

from tfring.elastic import run  # noqa: F401
from tfring.elastic.errors import (  # noqa: F401
    HorovodInternalError, HostsUpdatedInterrupt, InternalError)
from tfring.elastic.state import ObjectState, State  # noqa: F401
from tfring.torch.elastic.sampler import ElasticSampler  # noqa: F401
from tfring.torch.elastic.state import TorchState  # noqa: F401
