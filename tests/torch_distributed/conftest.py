# pytest plugin for the size-agnostic tfring.torch tests in this folder.
#
# Why: as in tests/distributed, the same files run under plain pytest (one
# rank) and under `mpirun -np N` (tests/test_torch_distributed.py), and the
# first failure on any rank aborts the job. torch gets one intra-op thread
# per rank (N ranks share two cores); tfring.torch is initialized once per
# session.

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rank_failures  # noqa: E402  (tests/rank_failures.py)

torch.set_num_threads(1)

import tfring.torch as hvd  # noqa: E402

(pytest_configure, pytest_runtest_logreport, pytest_collectreport,
 pytest_runtest_setup) = rank_failures.pytest_hooks()


@pytest.fixture(scope="session", autouse=True)
def tfring_initialized():
    hvd.init()
    yield


@pytest.fixture
def size():
    return hvd.size()


@pytest.fixture
def rank():
    return hvd.rank()
