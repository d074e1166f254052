# Elastic training across hosts: 3 "hosts" that are network namespaces of
# this machine (tools/netns_hosts.py). Both ranks of one host are killed
# with SIGKILL mid-step at once, and the others finish over MPI's TCP path
# from the last commit. (PRRTE ends the job when a
# host's daemon dies, so a lost host is its ranks killed: docs/elastic.md.)
# Then the host discovery script stops listing the third host: its rank
# leaves and the others go on without a rollback. A host whose daemon dies
# too ends the job (PRRTE), and tfringrun starts it again on the other
# hosts. Skips where network namespaces cannot be made.

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import mpi_launch
from test_multihost import namespace_hosts

REPO = Path(__file__).resolve().parent.parent
HOST_NAMES = ("hostA", "hostB", "hostC")
JOB_TIMEOUT_S = 300
TF_LOOP = str(REPO / "tests" / "elastic_scripts" / "tf_loop.py")
DISCOVER_HOSTS = str(REPO / "tests" / "elastic_scripts" / "discover_hosts.sh")


@pytest.fixture(scope="module")
def hosts():
    with namespace_hosts(HOST_NAMES) as made:
        yield made


def _run(hosts, options, script_args, ranks=3, slots=(1, 1, 1), status=0,
         timeout=JOB_TIMEOUT_S, **extra_env):
    argv = [sys.executable, "-m", "tfring.launcher.cli", "-np", str(ranks),
            "--min-np", "2", "-H",
            ",".join(f"{h}:{n}" for h, n in zip(HOST_NAMES, slots)),
            *options, sys.executable, TF_LOOP, *script_args]
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2",
               TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1",
               **hosts.mpi_env(), **extra_env)
    result = mpi_launch.launch_command(hosts[0].enter(argv, cwd=REPO),
                                       timeout, env=env, cwd=str(REPO))
    strays = hosts.stray_processes()
    assert not strays, f"left running: {strays}\n{result.describe()}"
    assert not result.timed_out, result.describe()
    assert result.returncode == status, result.describe()
    return result


def _check_results(result, steps, hosts_by_rank):
    """The ranks that finish: {original rank: host}, all at the same size,
    with the weights of the plain recurrence."""
    results = [json.loads(line.split("RESULT ", 1)[1])
               for line in result.output.splitlines() if "RESULT " in line]
    assert {r["original_rank"]: r["host"] for r in results} == hosts_by_rank, (
        result.describe())
    assert len(results) == len(hosts_by_rank), result.describe()
    assert all(r["size"] == len(results) for r in results), result.describe()
    assert all(r["weights"] == results[0]["weights"] for r in results), (
        result.describe())
    weights = np.array([1.0, -2.0, 0.5])
    for step in range(steps):
        weights = weights - (0.01 * weights + 0.001 * step)
    np.testing.assert_allclose(results[0]["weights"], weights, rtol=1e-12)


def test_a_whole_host_is_lost_then_the_job_grows_onto_another(hosts, tmp_path):
    # 4 ranks, 2 on hostA and 2 on hostB. Both ranks of hostB die together
    # (SIGKILL) at step 7: the ranks of hostA go on from the last commit.
    # At step 10 the discovery script lists hostC, unused so far: a rank
    # starts there at the next commit, receives the state, and the job
    # finishes at 3 ranks.
    steps = 24
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("hostA:2\nhostB:2\n")
    result = _run(hosts, ["--host-discovery-script", DISCOVER_HOSTS,
                          "--max-np", "4"],
                  ["host_lost_then_grow", str(steps), "3", "2", "7"],
                  ranks=4, slots=(2, 2, 1),
                  TFRING_TEST_HOSTS_FILE=str(hosts_file),
                  TFRING_TEST_NEW_HOSTS="hostA:2\nhostC:1\n",
                  TFRING_ELASTIC_DISCOVERY_INTERVAL="0.1")
    assert "saw a failure, resetting" in result.output, result.describe()
    _check_results(result, steps, {0: "hostA", 1: "hostA", 2: "hostC"})


def test_the_rank_of_a_host_no_longer_discovered_leaves_without_rollback(
        hosts, tmp_path):
    steps = 30
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("".join(f"{h}:1\n" for h in HOST_NAMES))
    result = _run(hosts, ["--host-discovery-script", DISCOVER_HOSTS],
                  ["rewrite_hosts", str(steps), "3", "0", "3"],
                  TFRING_TEST_HOSTS_FILE=str(hosts_file),
                  TFRING_TEST_NEW_HOSTS="hostA:1\nhostB:1\n",
                  TFRING_ELASTIC_DISCOVERY_INTERVAL="0.1")
    _check_results(result, steps, {0: "hostA", 1: "hostB"})
    assert ("the host discovery script no longer lists host hostC; its rank "
            "leaves the job") in result.output, result.describe()
    # A host change, not a failure: nobody rolled back.
    assert "saw a failure" not in result.output, result.describe()


def test_a_host_whose_daemon_dies_the_job_starts_again_on_the_other_hosts(
        hosts):
    # hostB's only rank (rank 1) kills hostB's PRRTE daemon, its parent, and
    # then itself at step 3: PRRTE 3.0 ends the job (every rank, on every
    # host) and its mpirun exits 0. tfringrun says which host was lost and
    # starts the job again on hostA and hostC (2 slots, --min-np 2), where
    # it resumes from the newest commit hostA or hostC kept on disk (every
    # 2 steps: commit N ends step 2N; at least the one of step 2, before
    # the kill) and finishes. The first launch's survivors would train for
    # 5.7 s more (0.1 s per step): PRRTE ends them first, so every result
    # comes from the second launch.
    steps = 60
    result = _run(hosts, [], ["daemon_lost", str(steps), "2", "1", "3"],
                  timeout=180)
    assert "PRTE has lost communication with a remote daemon" in (
        result.output), result.describe()
    assert ("tfringrun: starting the job again without host hostB, at 2 "
            "ranks on hostA:1,hostC:1 (restart 1; the program starts afresh "
            "and tfring.elastic.run resumes from the newest commit a host "
            "left kept on its disk;") in result.output, result.describe()
    assert "tfringrun: error" not in result.output, result.describe()
    resumed = re.search(r"tfring elastic: resuming from commit (\d+), kept "
                        r"on host (host[AC]) \(restart 1\)", result.output)
    assert resumed, result.describe()
    commit = int(resumed.group(1))
    assert commit >= 1, result.describe()
    # Each rank's training function started at step 0 in the first launch,
    # and at the commit's step in the second.
    for rank in (0, 1):
        assert (f"STARTED rank {rank} at step {2 * commit}" in result.output
                ), result.describe()
    _check_results(result, steps, {0: "hostA", 1: "hostC"})
    assert not list(Path("/tmp").glob("tfring-elastic-*")), (
        "tfringrun left its directory of kept commits")
