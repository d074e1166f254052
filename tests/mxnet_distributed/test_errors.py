# tfring.mxnet errors at any number of ranks: what one rank can get wrong
# alone fails in Python before C++ with a message that says what, what was
# expected and how to fix it; what ranks disagree about fails on every rank
# with HorovodInternalError naming the tensor, the field and the ranks;
# collectives work afterwards.

import mxnet as mx
import numpy as np
import pytest

import tfring.mxnet as hvd
from tfring.mxnet import ndarrays


def _still_works(size):
    result = hvd.allreduce(mx.nd.ones((2,)), op=hvd.Sum, name="after_error")
    np.testing.assert_array_equal(result.asnumpy(), size)


class _OnGpu:
    """Stands for an NDArray on a GPU (this MXNet build has no GPU)."""

    def __init__(self):
        self._array = mx.nd.zeros((2,))

    def __getattr__(self, item):
        if item == "context":
            return mx.gpu(0)
        return getattr(self._array, item)


def test_gpu_context(monkeypatch):
    monkeypatch.setattr(mx.nd, "NDArray", (mx.nd.NDArray, _OnGpu))
    with pytest.raises(ValueError, match=r"context gpu\(0\).*CPU NDArrays only.*as_in_context"):
        ndarrays.check_array(_OnGpu(), "allreduce")


def test_unsupported_dtypes_and_types(size):
    with pytest.raises(ValueError, match="dtype bool.*cannot reduce.*Expected one of"):
        hvd.allreduce(mx.nd.zeros((2,), dtype="bool"))
    with pytest.raises(TypeError, match="Expected an mxnet.nd.NDArray"):
        hvd.allreduce([1.0, 2.0])
    sparse = mx.nd.zeros((3, 3)).tostype("csr")
    with pytest.raises(ValueError, match="storage type 'csr'.*tostype"):
        hvd.allgather(sparse)
    _still_works(size)


def test_bad_arguments(size):
    with pytest.raises(ValueError, match=f"root_rank={size}.*only {size} ranks"):
        hvd.broadcast(mx.nd.zeros((1,)), root_rank=size)
    with pytest.raises(ValueError, match="reducescatter does not implement"):
        hvd.reducescatter(mx.nd.zeros((size,)), op=hvd.Max)
    scalar = mx.nd.array(1.0)
    with pytest.raises(ValueError, match=r"scalar NDArray.*at least one dimension.*reshape"):
        hvd.reducescatter(scalar)
    with pytest.raises(ValueError, match=r"scalar NDArray.*at least one dimension.*reshape"):
        hvd.grouped_reducescatter([mx.nd.zeros((size,)), scalar])
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(mx.nd.zeros((1,)), op=hvd.Adasum)
    with pytest.raises(TypeError, match="Expected a str"):
        hvd.allreduce(mx.nd.zeros((1,)), name=3)
    with pytest.raises(TypeError, match="splits"):
        hvd.alltoall(mx.nd.zeros((size,)), splits="a")
    with pytest.raises(TypeError, match="Expected a list of NDArrays"):
        hvd.grouped_allreduce(mx.nd.zeros((1,)))
    with pytest.raises(ValueError, match="Gluon ParameterDict"):
        hvd.broadcast_parameters([mx.nd.zeros((1,))])
    _still_works(size)


@pytest.mark.requires_ranks(2)
@pytest.mark.parametrize("field", ["shape", "dtype", "op", "root"])
def test_mismatch_fails_on_every_rank(field, rank, size):
    name = f"mismatch_{field}"
    with pytest.raises(hvd.HorovodInternalError) as caught:
        if field == "shape":
            hvd.allreduce(mx.nd.zeros((2 if rank == 0 else 3,)), name=name)
        elif field == "dtype":
            hvd.allreduce(mx.nd.zeros((2,), dtype="float32" if rank == 0 else "float64"),
                          name=name)
        elif field == "op":
            hvd.allreduce(mx.nd.zeros((2,)), name=name, op=hvd.Sum if rank == 0 else hvd.Max)
        else:
            hvd.broadcast(mx.nd.zeros((2,)), root_rank=0 if rank == 0 else 1, name=name)
    message = str(caught.value)
    assert name in message, message
    assert "rank 0" in message, message
    _still_works(size)


@pytest.mark.requires_ranks(2)
def test_alltoall_bad_splits_fail_on_every_rank(rank, size):
    splits = [1] * size
    if rank == 1:
        splits[0] = 5  # more rows than the array has
    with pytest.raises(hvd.HorovodInternalError, match="split") as raised:
        hvd.alltoall(mx.nd.zeros((size,)), splits=splits, name="bad_splits")
    assert isinstance(raised.value, ValueError)
    _still_works(size)


@pytest.mark.requires_ranks(2)
def test_grouped_lists_of_different_lengths(rank, size):
    tensors = [mx.nd.ones((1,)) for _ in range(2 if rank == 0 else 3)]
    with pytest.raises(ValueError, match="tensors|NDArrays"):
        hvd.grouped_allreduce(tensors, name="uneven_group")
    _still_works(size)
