# pytest plugin for the size-agnostic tfring.mxnet tests in this folder.
#
# Why: as in tests/torch_distributed, the same files run under plain pytest
# (one rank) and under `mpirun -np N` (tests/test_mxnet_distributed.py, with
# the MXNet environment's Python), and the first failure on any rank aborts
# the job. tfring.mxnet is initialized once per session.

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rank_failures  # noqa: E402  (tests/rank_failures.py)

import tfring.mxnet as hvd  # noqa: E402

(pytest_configure, pytest_runtest_logreport, pytest_collectreport,
 pytest_runtest_setup) = rank_failures.pytest_hooks()


@pytest.fixture(scope="session", autouse=True)
def tfring_initialized():
    hvd.init(process_sets="dynamic")  # test_process_set_and_join adds one
    yield


@pytest.fixture
def size():
    return hvd.size()


@pytest.fixture
def rank():
    return hvd.rank()
