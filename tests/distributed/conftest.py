# pytest plugin for the size-agnostic tests in this folder.
#
# Why: the same files run under plain pytest (one rank) and under
# `mpirun -np N`. Under mpirun a failing assertion on one rank would leave
# the others waiting in a collective forever, so the first failure on any
# rank prints its report and aborts the whole job. It also pins TensorFlow's
# thread pools (N ranks share two cores), initializes tfring once per
# session, and provides the `requires_ranks(n)` marker.

import os
import sys

import pytest
import tensorflow as tf

# Must run before TensorFlow creates its thread pools (the first op).
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import tfring  # noqa: E402


def _world():
    from mpi4py import MPI
    return MPI.COMM_WORLD


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "requires_ranks(n): skip unless at least n ranks take part")


def _abort_on_failure(report, what):
    comm = _world()
    if comm.Get_size() == 1:
        return
    text = getattr(report, "longreprtext", "") or str(report.longrepr)
    sys.stderr.write(
        f"\n===== tfring test {what} on rank {comm.Get_rank()} of "
        f"{comm.Get_size()}: {report.nodeid} ({report.when}) =====\n"
        f"{text}\n===== aborting the MPI job so no rank hangs =====\n")
    sys.stderr.flush()
    sys.stdout.flush()
    comm.Abort(1)


def pytest_runtest_logreport(report):
    if report.failed:
        _abort_on_failure(report, "failure")


def pytest_collectreport(report):
    if report.failed:
        _abort_on_failure(report, "collection error")


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("requires_ranks")
    if marker is not None and _world().Get_size() < marker.args[0]:
        pytest.skip(f"needs at least {marker.args[0]} ranks")


@pytest.fixture(scope="session", autouse=True)
def tfring_initialized():
    tfring.init()
    yield
    # Not shut down here: the atexit hook does it, which is also under test.


@pytest.fixture
def size():
    return tfring.size()


@pytest.fixture
def rank():
    return tfring.rank()


@pytest.fixture
def fusion_threshold():
    """TFRING_FUSION_THRESHOLD in bytes if the environment sets it."""
    value = os.environ.get("TFRING_FUSION_THRESHOLD")
    return int(value) if value else None
