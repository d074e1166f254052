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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rank_failures  # noqa: E402  (tests/rank_failures.py)

# Must run before TensorFlow creates its thread pools (the first op).
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import tfring  # noqa: E402


(pytest_configure, pytest_runtest_logreport, pytest_collectreport,
 pytest_runtest_setup) = rank_failures.pytest_hooks()


@pytest.fixture(scope="session", autouse=True)
def tfring_initialized():
    tfring.init()
    yield
    # Not shut down here: the atexit hook does it, which is also under test
    # (tests/test_distributed.py checks that every job exits cleanly so).
    assert tfring.is_initialized(), (
        "a test left tfring shut down: restore tfring.init() at its end, so "
        "that the job exits through the atexit hook with tfring running")


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
