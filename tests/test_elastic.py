"""Elastic training (tfring/elastic/, tfringrun's elastic options) with real
processes: 3 ranks under tfringrun on this machine, one killed with SIGKILL,
the survivors go on from the last commit. Every run has a timeout that ends
the whole job."""
import json
import os
import re
import sys

import numpy as np
import pytest

from mpi_launch import launch_command, working_tree_env
from tfring.elastic.blacklist import HostBlacklist
from tfring.elastic import membership
from tfring.elastic import runner as runner_loop
from tfring.elastic import settings
from tfring.elastic.discovery import removed_hosts
from tfring.launcher import cli as runner
from tfring.launcher import command as launch_command_line

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TF_LOOP = os.path.join(ROOT, "tests", "elastic_scripts", "tf_loop.py")
DISCOVER_HOSTS = os.path.join(ROOT, "tests", "elastic_scripts",
                              "discover_hosts.sh")
JOB_TIMEOUT_S = 480  # a bound for a hang; loaded CI machines need minutes
STEPS, COMMIT_EVERY = 12, 3


def _tfringrun(ranks, min_np, script_args, options=(), **extra_env):
    """tfringrun of `script_args` with the elastic options, under a timeout
    that ends every process of the job."""
    command = [sys.executable, "-m", "tfring.launcher.cli", "-np", str(ranks),
               "--min-np", str(min_np), *options, sys.executable, *script_args]
    env = working_tree_env(
        quiet_tensorflow=True, TF_NUM_INTRAOP_THREADS="1",
        TF_NUM_INTEROP_THREADS="1", OMP_NUM_THREADS="1",
        OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        **extra_env)
    return launch_command(command, JOB_TIMEOUT_S, env=env, cwd=ROOT)


def _results(output):
    return [json.loads(line.split("RESULT ", 1)[1])
            for line in output.splitlines() if "RESULT " in line]


def _expected_weights(steps):
    weights = np.array([1.0, -2.0, 0.5])
    for step in range(steps):
        weights = weights - (0.01 * weights + 0.001 * step)
    return weights


@pytest.mark.parametrize("scenario,kill_rank,kill_step", [
    ("mid_step", 0, 7),     # the oldest rank dies: rank 1 becomes rank 0
    ("mid_commit", 2, 6),   # dies inside commit(), after its own save
])
def test_killed_rank_survivors_finish_from_the_last_commit(
        scenario, kill_rank, kill_step, tmp_path):
    timeline = tmp_path / "timeline.json"
    result = _tfringrun(3, 2, [TF_LOOP, scenario, str(STEPS),
                               str(COMMIT_EVERY), str(kill_rank),
                               str(kill_step)], TFRING_TIMELINE=str(timeline))
    assert not result.timed_out, result.describe()
    assert result.returncode == 0, result.describe()
    results = _results(result.output)
    assert sorted(r["original_rank"] for r in results) == sorted(
        r for r in range(3) if r != kill_rank), result.describe()
    assert all(r["size"] == 2 for r in results), result.describe()
    # The oldest survivor is rank 0.
    ranks = {r["original_rank"]: r["rank"] for r in results}
    assert ranks[min(ranks)] == 0, result.describe()
    # Identical on the survivors, and the plain recurrence: no step lost
    # or repeated, and Average divided by 2 after the reset inside the
    # tf.function traced at 3 ranks.
    assert results[0]["weights"] == results[1]["weights"], result.describe()
    np.testing.assert_allclose(results[0]["weights"],
                               _expected_weights(STEPS), rtol=1e-12)
    steps_sum = sum(step + 1 for step in range(STEPS))
    np.testing.assert_allclose(
        results[0]["embedding"], [0.0, -0.01 * steps_sum, 0.0, -0.02 * steps_sum],
        rtol=1e-12)
    if kill_rank != 0:
        # Rank 0 lived: its timeline goes on across the reset, marked, in
        # one valid file.
        with open(timeline) as f:
            events = json.load(f)["traceEvents"]
        [reset] = [e for e in events if e["name"] == "elastic reset"]
        assert reset["args"]["detail"] == "reset 1: 3 ranks before, 2 after"
        assert any(e.get("ts", 0) > reset["ts"] and e.get("ph") == "X"
                   for e in events), events


def test_a_rank_that_dies_during_the_reset_causes_one_more_reset():
    result = _tfringrun(4, 2, [TF_LOOP, "during_reset", str(STEPS),
                               str(COMMIT_EVERY), "3", "7"])
    assert not result.timed_out, result.describe()
    assert result.returncode == 0, result.describe()
    results = _results(result.output)
    assert sorted(r["original_rank"] for r in results) == [0, 1], result.describe()
    assert all(r["size"] == 2 for r in results), result.describe()
    # Both survivors reset twice.
    assert result.output.count("saw a failure, resetting") >= 4, result.describe()
    assert results[0]["weights"] == results[1]["weights"], result.describe()
    np.testing.assert_allclose(results[0]["weights"],
                               _expected_weights(STEPS), rtol=1e-12)


def test_ranks_whose_training_function_raises_leave_and_the_others_go_on():
    # Rank 2's training function raises at step 4, then rank 0's (the
    # state's source) at step 7: rank 1 finishes alone, from the last
    # commits, and the job succeeds.
    result = _tfringrun(3, 1, [TF_LOOP, "raise", str(STEPS), str(COMMIT_EVERY),
                               "2", "4"])
    assert not result.timed_out, result.describe()
    assert result.returncode == 0, result.describe()
    [survivor] = _results(result.output)
    assert (survivor["original_rank"], survivor["rank"], survivor["size"]) == (
        1, 0, 1), result.describe()
    np.testing.assert_allclose(survivor["weights"], _expected_weights(STEPS),
                               rtol=1e-12)
    for rank, step in ((2, 4), (0, 7)):
        assert re.search(
            rf"rank \d's training function raised RuntimeError: rank {rank} "
            rf"raised at step {step} on purpose; the rank leaves the job, and "
            r"the others go on without it from the last commit",
            result.output), result.describe()


def test_the_job_fails_with_the_error_when_every_rank_raises():
    result = _tfringrun(3, 1, [TF_LOOP, "all_raise", str(STEPS),
                               str(COMMIT_EVERY), "0", "4"])
    assert not result.timed_out, result.describe()
    assert result.returncode != 0, result.describe()
    # Which ranks raise first, and so leave before the others, varies; the
    # last ones end the job with their error.
    assert re.search(
        r"training function raised RuntimeError: rank \d raised at step 4 on "
        r"purpose, and so did every other rank left in the job; the job ends "
        r"with the error", result.output), result.describe()
    assert re.search(r"RuntimeError: rank \d raised at step 4 on purpose\n",
                     result.output), result.describe()
    assert "RESULT" not in result.output


def _discovering_run(tmp_path, hosts_listed, ranks, min_np, script_args, options,
                     **extra_env):
    """A job whose discovery script lists `hosts_listed` (polled often)."""
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text(hosts_listed)
    return _tfringrun(
        ranks, min_np, script_args,
        options=[*options, "--host-discovery-script", DISCOVER_HOSTS],
        TFRING_TEST_HOSTS_FILE=str(hosts_file),
        TFRING_ELASTIC_DISCOVERY_INTERVAL="0.1", **extra_env)


def test_a_discovered_slot_gets_a_new_rank_whose_death_the_others_survive(
        tmp_path):
    # The job grows from 2 ranks to 3; the started rank dies one step after
    # its first commit, and the others finish from that commit. (Started
    # ranks that finish, with the state they received: the tests below and
    # test_elastic_multihost.py.)
    steps = 40
    result = _discovering_run(
        tmp_path, "localhost:2\n", 2, 1,
        [TF_LOOP, "grow", str(steps), str(COMMIT_EVERY), "3", "3"],
        ["--max-np", "3", "-H", "localhost:3"])
    assert not result.timed_out, result.describe()
    # Not ended by the started rank's death (prterun's status was 137).
    assert result.returncode == 0, result.describe()
    assert "DYING started rank 2 at size 3" in result.output, result.describe()
    results = _results(result.output)
    assert sorted(r["original_rank"] for r in results) == [0, 1], result.describe()
    assert all(r["size"] == 2 for r in results), result.describe()
    assert results[0]["weights"] == results[1]["weights"], result.describe()
    np.testing.assert_allclose(results[0]["weights"],
                               _expected_weights(steps), rtol=1e-12)


def test_a_start_that_never_joins_is_given_up_and_the_ranks_go_on(tmp_path):
    # The job grows from 2 ranks to 3, but the started program never joins
    # (as when PRRTE's spawn fails in its daemon): after the spawn timeout
    # the 2 ranks agree that the growth failed, blacklist the host and
    # finish at 2 ranks; without the bound they would wait forever.
    result = _discovering_run(
        tmp_path, "localhost:2\n", 2, 1,
        [TF_LOOP, "spawn_fails", str(STEPS), str(COMMIT_EVERY), "3", "3"],
        ["--max-np", "3", "-H", "localhost:3", "--spawn-timeout", "5"])
    assert not result.timed_out, result.describe()
    assert result.returncode == 0, result.describe()
    assert re.search(r"starting ranks on host\(s\) localhost failed: "
                     r"MPI_Comm_spawn did not finish within 5 s", result.output
                     ), result.describe()
    results = _results(result.output)
    assert sorted(r["original_rank"] for r in results) == [0, 1], result.describe()
    assert all(r["size"] == 2 for r in results), result.describe()
    assert results[0]["weights"] == results[1]["weights"], result.describe()
    np.testing.assert_allclose(results[0]["weights"],
                               _expected_weights(STEPS), rtol=1e-12)


def test_below_min_np_without_a_script_ends_the_job_at_once(monkeypatch):
    # No rank could join: no wait. (A job ended below --min-np, with real
    # ranks: the timeout test below.)
    monkeypatch.delenv("TFRING_ELASTIC_DISCOVERY_SCRIPT", raising=False)
    members = type("Members", (), {"resets": 1, "comm": type(
        "Comm", (), {"Get_size": lambda self: 2})()})()
    limits = settings.Settings(enabled=True, min_np=3)
    with pytest.raises(RuntimeError, match=r"only 2 ranks are left after a "
                       r"reset, fewer than the minimum 3 \(--min-np\)"):
        runner_loop._check_limits(members, limits)


def test_below_min_np_waits_for_usable_slots_until_the_timeout(tmp_path):
    # A slot is free after the death, but on the host where the rank died,
    # which gets no new rank (blacklisted for good without a cooldown range).
    # Rank 1 dies when the wait starts: the last rank resets and waits again.
    result = _discovering_run(
        tmp_path, "localhost:3\n", 3, 3,
        [TF_LOOP, "die_waiting", str(STEPS), str(COMMIT_EVERY), "2", "4"],
        ["-H", "localhost:3", "--elastic-timeout", "2"])
    assert not result.timed_out, result.describe()
    assert result.returncode != 0, result.describe()
    assert re.search(r"rank 0 saw a failure while waiting for free slots, "
                     r"resetting", result.output), result.describe()
    assert re.search(r"only 1 ranks are left after a reset, and the host "
                     r"discovery script listed no usable free slots for the "
                     r"2 more that the minimum 3 \(--min-np\) needs within "
                     r"2 s \(--elastic-timeout\)", result.output), result.describe()
    assert "RESULT" not in result.output


def test_below_min_np_a_slot_listed_during_the_wait_gets_a_rank(tmp_path):
    # Rank 1 dies; the listing has no free slot. When the wait starts, the
    # script lists one more slot, on the host where the rank died, usable
    # again after its 1 s cooldown: a rank is started there, receives the
    # state, and the job finishes at 3 ranks.
    result = _discovering_run(
        tmp_path, "localhost:2\n", 3, 3,
        [TF_LOOP, "refill", str(STEPS), str(COMMIT_EVERY), "1", "4"],
        ["-H", "localhost:3", "--elastic-timeout", "120",
         "--blacklist-cooldown-range", "1", "1"],
        TFRING_TEST_NEW_HOSTS="localhost:3\n")
    assert not result.timed_out, result.describe()
    assert result.returncode == 0, result.describe()
    results = _results(result.output)
    assert sorted(r["original_rank"] for r in results) == [0, 2, 2], result.describe()
    assert all(r["size"] == 3 for r in results), result.describe()
    assert results[0]["weights"] == results[1]["weights"] == results[2]["weights"]
    np.testing.assert_allclose(results[0]["weights"],
                               _expected_weights(STEPS), rtol=1e-12)


def _command(argv, cpu_count=8):
    args = runner.parse_args(argv)
    return launch_command_line.mpirun_command(args, "/opt/mpi/bin/mpirun", {},
                                              1000, cpu_count)


def test_elastic_options_run_open_mpi_fault_tolerant_and_tell_the_ranks():
    command = _command(["-np", "4", "--min-np", "2", "--max-np", "6",
                        "--reset-limit", "3", "python", "train.py"])
    assert command[command.index("--with-ft") + 1] == "ulfm"
    # Started ranks' jobs too: a started rank's death does not end prterun.
    recoverable = command.index("state_base_recoverable")
    assert command[recoverable - 1:recoverable + 2] == [
        "--prtemca", "state_base_recoverable", "1"], command
    for setting in ("TFRING_ELASTIC=1", "TFRING_ELASTIC_MIN_NP=2",
                    "TFRING_ELASTIC_MAX_NP=6", "TFRING_ELASTIC_RESET_LIMIT=3",
                    "TFRING_SHM=0", "MPI4PY_RC_FINALIZE=0"):
        assert setting in command, command
    assert command[-2:] == ["python", "train.py"]
    plain = _command(["-np", "4", "python", "train.py"])
    assert "--with-ft" not in plain and "TFRING_ELASTIC=1" not in plain


def test_a_discovery_script_tells_the_ranks_the_launch_hosts():
    command = _command(["-np", "2", "--max-np", "4", "-H", "localhost:4",
                        "--host-discovery-script", "hosts.sh", "--slots", "2",
                        "--blacklist-cooldown-range", "1", "30",
                        "python", "train.py"])
    for setting in ("TFRING_ELASTIC=1", "TFRING_ELASTIC_HOSTS=localhost:4",
                    "TFRING_ELASTIC_SLOTS=2", "TFRING_ELASTIC_DISCOVERY_SCRIPT="
                    + os.path.abspath("hosts.sh"),
                    "TFRING_ELASTIC_BLACKLIST_COOLDOWN=1,30"):
        assert setting in command, command
    assert "TFRING_ELASTIC_SPAWN_TIMEOUT" not in " ".join(command)
    timed = _command(["-np", "2", "--max-np", "4", "-H", "localhost:4",
                      "--host-discovery-script", "hosts.sh",
                      "--spawn-timeout", "30", "python", "train.py"])
    assert "TFRING_ELASTIC_SPAWN_TIMEOUT=30.0" in timed, timed
    # Started ranks are another MPI job, which shared memory cannot reach.
    assert command[command.index("btl") + 1] == "self,sm,tcp", command


@pytest.mark.parametrize("argv,message", [
    (["-np", "2", "--min-np", "3"], r"out of order. Expected 1 <= --min-np"),
    (["-np", "4", "--max-np", "3"], r"out of order"),
    (["-np", "2", "--min-np", "1", "--reset-limit", "-1"],
     r"--reset-limit -1 is negative"),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "1", "2"],
     r"--blacklist-cooldown-range applies to hosts found by "
     r"--host-discovery-script"),
    (["-np", "2", "--host-discovery-script", "hosts.sh",
      "--blacklist-cooldown-range", "5", "2"],
     r"--blacklist-cooldown-range 5 2 is out of range. Expected 1 <= LO <= "
     r"HI <= 3600"),
    (["-np", "2", "--min-np", "1", "--slots", "2"],
     r"--slots applies to hosts found by --host-discovery-script"),
    (["-np", "2", "--min-np", "1", "--spawn-timeout", "0"],
     r"--spawn-timeout 0 is not a positive number of seconds"),
    (["-np", "2", "--min-np", "1", "--elastic-timeout", "-5"],
     r"--elastic-timeout -5 is not a non-negative number of seconds"),
])
def test_bad_elastic_options_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        runner.parse_args(argv + ["python", "train.py"])
    assert re.search(message, capsys.readouterr().err)


def test_a_bad_spawn_timeout_is_refused_and_the_default_is_two_minutes():
    assert settings.from_environment({}).spawn_timeout_s == 120.0
    assert settings.from_environment(
        {"TFRING_ELASTIC_SPAWN_TIMEOUT": "7.5"}).spawn_timeout_s == 7.5
    with pytest.raises(ValueError, match=r"TFRING_ELASTIC_SPAWN_TIMEOUT='-1' "
                       r"is not a positive number of seconds"):
        settings.from_environment({"TFRING_ELASTIC_SPAWN_TIMEOUT": "-1"})


def test_an_elastic_timeout_of_zero_is_kept_and_a_bad_one_is_refused():
    assert settings.from_environment({}).timeout_s == 600.0
    assert settings.from_environment(
        {"TFRING_ELASTIC_TIMEOUT": "0"}).timeout_s == 0.0
    with pytest.raises(ValueError, match=r"TFRING_ELASTIC_TIMEOUT='soon' "
                       r"is not a non-negative number of seconds"):
        settings.from_environment({"TFRING_ELASTIC_TIMEOUT": "soon"})


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_host_where_a_rank_died_gets_no_new_ranks_for_good_by_default():
    clock = _Clock()
    blacklist = HostBlacklist(clock=clock)
    blacklist.add("node2")
    clock.now += 1e6
    assert blacklist.usable({"node1": 2, "node2": 2}) == {"node1": 2}


def test_the_cooldown_doubles_with_each_failure_within_the_range():
    # Horovod's cooldown: LO * 2**failures + LO * jitter, kept in [LO, HI].
    clock = _Clock()
    blacklist = HostBlacklist((2.0, 10.0), clock=clock, jitter=lambda: 0.5)
    blacklist.add("node2")  # 2 * 2 + 1 = 5 s
    clock.now += 4.9
    assert blacklist.is_blacklisted("node2")
    blacklist.add("node2")  # still cooling down: the end stays
    clock.now += 0.2
    assert blacklist.usable({"node2": 1}) == {"node2": 1}
    blacklist.add("node2")  # second failure: 2 * 4 + 1 = 9 s
    clock.now += 8.9
    assert blacklist.is_blacklisted("node2")
    clock.now += 0.2
    assert not blacklist.is_blacklisted("node2")
    blacklist.add("node2")  # third: 2 * 8 + 1 = 17 s, capped at 10
    clock.now += 9.9
    assert blacklist.is_blacklisted("node2")
    clock.now += 0.2
    assert not blacklist.is_blacklisted("node2")


def test_hosts_no_longer_listed_leave_unless_none_of_the_job_is_listed(
        capsys):
    running = {"node1": 2, "node2": 1, "node3": 1}
    assert removed_hosts({"node1": 2, "node2": 1}, running) == ["node3"]
    # An empty listing (or other names) keeps every rank, with a warning.
    assert removed_hosts({}, running) == []
    assert removed_hosts({"other": 4}, running) == []
    assert capsys.readouterr().err.count("lists none of the job's hosts") == 1


class _Communicator:
    """What Membership needs of a communicator to drop departing ranks:
    every rank's (raised, on a leaving host, host), and Split."""

    UNDEFINED = -32766

    def __init__(self, rank, departures):
        self.rank, self.departures, self.colors = rank, departures, []

    def allgather(self, mine):
        assert mine == self.departures[self.rank]
        return self.departures

    def Get_rank(self):
        return self.rank

    def Split(self, color, key):
        self.colors.append(color)
        return None if color == self.UNDEFINED else "remaining"


def _departing(monkeypatch, rank, departures, leaving_hosts=()):
    members = membership.Membership()
    monkeypatch.setattr(membership, "_mpi", lambda: _Communicator)
    members.raised, members._host = departures[rank][0], departures[rank][2]
    members.leaving_hosts = set(leaving_hosts)
    comm = _Communicator(rank, departures)
    return members, comm, members._without_departing_ranks(comm)


def test_a_rank_that_raised_departs_and_its_host_is_blacklisted(monkeypatch):
    departures = [(False, False, "node1"), (True, False, "node2")]
    members, comm, remaining = _departing(monkeypatch, 0, departures)
    assert (remaining, members.left, members.job_failed) == (
        "remaining", False, False)
    assert members.blacklist.is_blacklisted("node2")
    members, comm, remaining = _departing(monkeypatch, 1, departures)
    assert (remaining, members.left, members.job_failed) == (None, True, False)
    assert comm.colors == [_Communicator.UNDEFINED]


def test_when_only_ranks_that_raised_remain_the_job_fails(monkeypatch):
    # Rank 1 leaves with its host, rank 0 raised: nobody would go on.
    departures = [(True, False, None), (False, True, "node2")]
    members, comm, remaining = _departing(monkeypatch, 0, departures)
    assert (remaining, members.left, members.job_failed) == (None, False, True)
    members, comm, remaining = _departing(monkeypatch, 1, departures, ["node2"])
    assert (remaining, members.left, members.job_failed) == (None, True, False)
    assert comm.colors == []  # every rank knows: no split


def test_without_departures_the_communicator_stays(monkeypatch):
    departures = [(False, False, None)] * 2
    members, comm, remaining = _departing(monkeypatch, 1, departures)
    assert remaining is comm and comm.colors == [] and not members.left
