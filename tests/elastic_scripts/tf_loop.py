"""A custom TensorFlow training loop under tfring.elastic.run, for
tests/test_elastic.py.

Usage: tf_loop.py SCENARIO STEPS COMMIT_EVERY KILL_RANK KILL_STEP
SCENARIO: none, mid_step (KILL_RANK dies with SIGKILL before its
allreduce at step KILL_STEP), mid_commit (it dies inside commit(), after
saving, at the commit that ends step KILL_STEP) or during_reset (as
mid_step, and rank KILL_RANK - 1 dies in the reset that follows, after the
survivors rebuilt the job and before the state is synced) or grow (rank 0
writes `localhost:KILL_RANK` to $TFRING_TEST_HOSTS_FILE, which the host
discovery script prints, at step KILL_STEP: the job grows to KILL_RANK
ranks at a later commit; a rank it starts dies with SIGKILL mid-step, one
step after its first commit) or rewrite_hosts (as grow, writing
$TFRING_TEST_NEW_HOSTS instead: hosts it leaves out lose their ranks) or
raise (KILL_RANK's training function raises at step KILL_STEP, then rank
0's, if it is another, COMMIT_EVERY steps later) or all_raise (every rank's
training function raises at step KILL_STEP) or refill (as mid_step, and
when the job, now below --min-np, starts waiting for free slots, rank 0
writes $TFRING_TEST_NEW_HOSTS to $TFRING_TEST_HOSTS_FILE) or die_waiting
(as mid_step, and rank KILL_RANK - 1 dies when the wait for free slots
starts) or host_lost_then_grow (ranks KILL_RANK and above, a whole host,
die together with SIGKILL before their allreduce at step KILL_STEP; then
rank 0 writes $TFRING_TEST_NEW_HOSTS to $TFRING_TEST_HOSTS_FILE at step
KILL_STEP + COMMIT_EVERY) or spawn_fails (as grow, but the program started
is never_joins.sh, which never joins: the ranks give up after the spawn
timeout and go on) or daemon_lost (KILL_RANK, the only rank of its host,
kills its parent, that host's PRRTE daemon prted, and then itself with
SIGKILL before its allreduce at step KILL_STEP: the whole host is lost; the
steps after KILL_STEP take 0.1 s each, so the job is still training when
PRRTE ends it; in a job tfringrun started again, nobody is killed, and
tfring.elastic.run resumes from the newest commit a host kept). Each rank
prints the step its training function first starts at.

The gradient is the same on every rank, so the average is the same at any
number of ranks: the final weights must equal the plain recurrence in the
test, whatever the failures (no lost or repeated step after the rollback),
provided Average divides by the number of ranks at the time it runs (for
dense tensors and IndexedSlices alike).
"""
import json
import os
import signal
import time
import socket
import sys

import tensorflow as tf

import tfring
import tfring.elastic as elastic
from tfring.elastic import discovery
from tfring.elastic import settings as elastic_settings

scenario = sys.argv[1]
steps, commit_every, kill_rank, kill_step = map(int, sys.argv[2:6])

tfring.init()
original_rank = tfring.rank()
weights = tf.Variable([1.0, -2.0, 0.5], dtype=tf.float64)
# Updated by an averaged IndexedSlices (gathered, then divided by the
# number of ranks): the same at any number of ranks too.
embedding = tf.Variable(tf.zeros([4], tf.float64))


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def kill_daemon_and_die():
    # The parent must be prted: a rank whose parent is prterun (on the
    # launching host) or that was orphaned must not kill it.
    daemon = os.getppid()
    with open(f"/proc/{daemon}/comm") as f:
        name = f.read().strip()
    if name != "prted":
        raise AssertionError(f"rank {original_rank}'s parent {daemon} is "
                             f"{name!r}, not prted: put it on another host")
    print(f"KILLING prted {daemon} of {socket.gethostname()}", flush=True)
    os.kill(daemon, signal.SIGKILL)
    die()


class CommitDyingState(elastic.TensorFlowState):
    def commit(self):
        self.save()
        if (scenario == "mid_commit" and original_rank == kill_rank
                and self.step == kill_step):
            die()
        self.check_host_updates()


state = CommitDyingState([weights, embedding], step=0)


def on_wait_for_slots(action):
    # Every rank reads the discovery interval when the wait below --min-np
    # starts (tfring/elastic/refill.py): the hook of these scenarios.
    interval_s = discovery.interval_s

    def hooked():
        action()
        return interval_s()

    discovery.interval_s = hooked


def list_new_hosts():
    with open(os.environ["TFRING_TEST_HOSTS_FILE"], "w") as f:
        f.write(os.environ["TFRING_TEST_NEW_HOSTS"])


if scenario == "refill" and original_rank == 0:
    on_wait_for_slots(list_new_hosts)
if scenario == "die_waiting" and original_rank == kill_rank - 1:
    on_wait_for_slots(die)
if scenario == "during_reset" and original_rank == kill_rank - 1:
    state.register_reset_callbacks([die])


@tf.function
def train_step(step):
    gradient = 0.01 * weights + 0.001 * tf.cast(step, tf.float64)
    weights.assign_sub(tfring.allreduce(gradient, op=tfring.Average))
    # Constants in the function: the collectives must still run at every
    # call (not be constant-folded when the function is optimized), or the
    # gathered rows and this count would keep the size the function was
    # first run at.
    rows = tf.IndexedSlices(
        tf.constant([1.0, 2.0], tf.float64) * 0.01 * tf.cast(step + 1, tf.float64),
        tf.constant([1, 3], tf.int64), tf.constant([4], tf.int64))
    averaged = tfring.allreduce(rows, op=tfring.Average)
    embedding.scatter_sub(tf.IndexedSlices(averaged.values, averaged.indices))
    return tfring.allreduce(tf.constant(1, tf.int32), op=tfring.Sum)


# Set for the ranks started into the running job (tfring/elastic/membership.py).
started_rank = bool(os.environ.get("TFRING_ELASTIC_HOST"))
if scenario == "spawn_fails":
    # MPI_Comm_spawn starts sys.executable (with the joiner's arguments).
    sys.executable = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                  "never_joins.sh")
joined_at_step = None


@elastic.run
def train(state):
    global joined_at_step
    if joined_at_step is None:
        joined_at_step = state.step
        print(f"STARTED rank {original_rank} at step {state.step}", flush=True)
    while state.step < steps:
        if (scenario == "grow" and started_rank
                and state.step == joined_at_step + commit_every + 1):
            print(f"DYING started rank {original_rank} at size {tfring.size()}",
                  flush=True)
            die()
        if (scenario == "host_lost_then_grow" and original_rank >= kill_rank
                and state.step == kill_step):
            die()
        if (scenario == "host_lost_then_grow" and original_rank == 0
                and state.step == kill_step + commit_every):
            list_new_hosts()
        if (scenario == "daemon_lost" and original_rank == kill_rank
                and state.step == kill_step
                and not elastic_settings.from_environment().restarts):
            kill_daemon_and_die()
        if scenario == "daemon_lost" and state.step > kill_step:
            time.sleep(0.1)
        if (scenario in ("mid_step", "during_reset", "refill", "die_waiting")
                and original_rank == kill_rank
                and state.step == kill_step):
            die()
        if scenario in ("grow", "rewrite_hosts", "host_lost_then_grow",
                        "spawn_fails"):
            if (scenario != "host_lost_then_grow" and original_rank == 0
                    and state.step == kill_step):
                with open(os.environ["TFRING_TEST_HOSTS_FILE"], "w") as f:
                    f.write(f"localhost:{kill_rank}\n"
                            if scenario in ("grow", "spawn_fails")
                            else os.environ["TFRING_TEST_NEW_HOSTS"])
            time.sleep(0.05)  # time for the discovery script's next run
        raises_at = {kill_rank: kill_step}
        raises_at.setdefault(0, kill_step + commit_every)
        if ((scenario == "raise" and raises_at.get(original_rank) == state.step)
                or (scenario == "all_raise" and state.step == kill_step)):
            raise RuntimeError(f"rank {original_rank} raised at step "
                               f"{state.step} on purpose")
        ranks = int(train_step(tf.constant(state.step, tf.int64)))
        if ranks != tfring.size():
            raise AssertionError(f"a Sum of 1 on every rank gave {ranks} at "
                                 f"size {tfring.size()}")
        state.step += 1
        if state.step % commit_every == 0:
            state.commit()


train(state)
print("RESULT " + json.dumps({
    "original_rank": original_rank, "rank": tfring.rank(),
    "host": socket.gethostname(),
    "size": tfring.size(), "weights": weights.numpy().tolist(),
    "embedding": embedding.numpy().tolist()}), flush=True)
