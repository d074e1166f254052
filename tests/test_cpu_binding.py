"""TFRING_CPU_BINDING in real jobs: each rank of a host on its own share of
the host's CPUs.

Jobs of tests/job_scripts/cpu_binding_job.py report where every rank may run
before and after tfring.init(). By default nothing changes. With
TFRING_CPU_BINDING=1, the ranks of a host launched unbound (as tfringrun
launches, with --bind-to none) that has at least as many CPUs as ranks end
on disjoint shares that together cover the CPUs they had, with every thread
of the process bound; with more ranks than CPUs, or when mpirun bound each
rank itself, nothing changes.
"""
import os
import re
import sys
from pathlib import Path

import pytest

import mpi_launch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "job_scripts" / "cpu_binding_job.py"
JOB_TIMEOUT_S = 240
LINE = re.compile(r"^rank (\d+) of (\d+) before (\S*) after (\S*) threads (\S*)$",
                  re.MULTILINE)
CPUS = len(os.sched_getaffinity(0))


def _cpu_set(text):
    return frozenset(int(cpu) for cpu in text.split(",") if cpu)


def _run(ranks, command=None, **env_extra):
    """Runs the job; a variable given as None is removed from its
    environment."""
    env = mpi_launch.working_tree_env(quiet_tensorflow=True, **env_extra)
    env = {name: value for name, value in env.items() if value is not None}
    argv = [sys.executable, str(SCRIPT)]
    if command is None:
        result = mpi_launch.launch(argv, ranks, JOB_TIMEOUT_S, env=env, cwd=str(ROOT))
    else:
        result = mpi_launch.launch_command(command + argv, JOB_TIMEOUT_S, env=env,
                                           cwd=str(ROOT))
    assert result.returncode == 0 and not result.timed_out, result.describe()
    found = {int(rank): (_cpu_set(before), _cpu_set(after),
                         [_cpu_set(s) for s in threads.split(";")])
             for rank, size, before, after, threads in LINE.findall(result.output)}
    assert sorted(found) == list(range(ranks)), result.describe()
    return found, result


def _assert_unchanged(found, result):
    for rank, (before, after, threads) in found.items():
        assert after == before, (rank, result.describe())
        assert all(cpus == before for cpus in threads), (rank, result.describe())


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_stay_as_launched_by_default(ranks):
    # TensorFlow sizes its default thread pools for the whole machine before
    # init(); binding a rank afterwards would crowd them onto its share.
    found, result = _run(ranks, TFRING_CPU_BINDING=None)
    _assert_unchanged(found, result)


@pytest.mark.parametrize("ranks", [2, 3])
def test_unbound_ranks_take_disjoint_shares_of_the_cpus(ranks):
    found, result = _run(ranks, TFRING_LOG_LEVEL="info", TFRING_CPU_BINDING="1")
    if CPUS < ranks:
        # More ranks than CPUs: sharing is unavoidable, so nothing is bound.
        _assert_unchanged(found, result)
        return
    everything = found[0][0]
    taken = set()
    for rank, (before, after, threads) in found.items():
        assert before == everything, (rank, result.describe())
        assert after and not (after & taken), (rank, result.describe())
        assert abs(len(after) - len(everything) // ranks) <= 1, (rank, result.describe())
        # Every thread, including one started before init.
        assert all(cpus == after for cpus in threads), (rank, result.describe())
        taken |= after
    assert taken == everything, result.describe()
    assert "local rank 0's share of" in result.output, result.describe()




@pytest.mark.skipif(CPUS < 2, reason="mpirun needs a core per rank to bind them")
def test_a_binding_mpirun_made_is_kept():
    # Open MPI binds each rank to its own core here: the ranks' CPU sets
    # differ, so tfring leaves them as they are.
    command = [mpi_launch.mpirun_path(), "-np", "2", "--bind-to", "core",
               "-x", mpi_launch.TAG_VARIABLE]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    found, result = _run(2, command=command, TFRING_CPU_BINDING="1")
    _assert_unchanged(found, result)
    assert len({frozenset(after) for _, after, _ in found.values()}) == 2, result.describe()
