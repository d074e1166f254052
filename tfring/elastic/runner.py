# The run loop of `@tfring.elastic.run`: call the training function, and on
# a failure or a host change rebuild the job and call it again.
#
# Why: the user writes one training function that starts from `state`; this
# loop turns a dead rank into a rollback to the last commit on the
# survivors (InternalError), and a host change into a reset without
# rollback (HostsUpdatedInterrupt), as Horovod's elastic run does; the ranks
# of a host no longer discovered leave there. A rank whose training function
# raises is a failed rank too, as in Horovod: it stops every rank's
# collectives, leaves at the reset, and the others go on from the last
# commit; the job ends with the error only when every rank left raised. It
# decides whether an exception is a failure by asking the core (a collective
# that failed because a peer died arrives as the framework's own error type)
# and MPI (a failure seen by mpi4py while the state was broadcast). In a job
# tfringrun started again after a lost host, it first makes the newest
# commit a host kept on disk every rank's state (kept_commit.py).

import functools
import sys
import traceback

from tfring import _core
from tfring import basics as _basics
from tfring.elastic import discovery as _discovery
from tfring.elastic import kept_commit as _kept_commit
from tfring.elastic import membership as _membership
from tfring.elastic import refill as _refill
from tfring.elastic import settings as _settings
from tfring.elastic.errors import HostsUpdatedInterrupt, InternalError


def _is_failure(error):
    # Exactly InternalError: front ends derive other errors from it (a
    # mismatch between ranks), which are no failure of the job.
    return (type(error) is InternalError or _core.stopped_by_failure()
            or _membership.is_process_failure(error))


def _reason(error):
    # A framework wraps the core's message ("Graph execution error: ...");
    # the line that names tfring says why.
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for key in ("tfring stopped", "tfring"):
        for line in lines:
            if key in line:
                return line[line.index(key):]
    return lines[0] if lines else type(error).__name__


def _check_limits(members, settings):
    size = members.comm.Get_size()
    if settings.reset_limit and members.resets > settings.reset_limit:
        raise RuntimeError(
            f"tfring elastic: the job was reset {members.resets} times, more "
            f"than the reset limit {settings.reset_limit} (--reset-limit). "
            "Expected the ranks to stay up between resets. Find why ranks "
            "fail (their output names the cause), or raise --reset-limit.")
    if size < settings.min_np and _discovery.enabled():
        raise RuntimeError(
            f"tfring elastic: only {size} ranks are left after a reset, and "
            f"the host discovery script listed no usable free slots for the "
            f"{settings.min_np - size} more that the minimum "
            f"{settings.min_np} (--min-np) needs within "
            f"{settings.timeout_s:g} s (--elastic-timeout). Expected the "
            "script to list enough free slots on hosts of the launch's "
            "-H/--hostfile where no rank died (those get no new ranks, for "
            "good or for --blacklist-cooldown-range). Make more hosts usable, "
            "raise --elastic-timeout, or lower --min-np.")
    if size < settings.min_np:
        raise RuntimeError(
            f"tfring elastic: only {size} ranks are left after a reset, fewer "
            f"than the minimum {settings.min_np} (--min-np). Expected at "
            f"least {settings.min_np} ranks to go on training. Start the job "
            "again on more hosts, or lower --min-np.")


def run_fn(func, before_reset=None):
    """Wraps `func(state, *args, **kwargs)` in the elastic run loop.

    `before_reset` (optional) runs on every rank before the job is rebuilt,
    for a front end's own clean-up."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        settings = _settings.from_environment()
        if not settings.enabled:
            # Not launched elastic (plain mpirun, tfringrun without the
            # elastic options): MPI's fault tolerance is off, so there is
            # nothing to recover with; run once, as Horovod does there.
            state.sync()
            return func(state, *args, **kwargs)
        members = _membership.current()
        members.start()
        _resume_from_kept_commit(state, members, settings)
        skip_sync = False
        while True:
            failed = False
            try:
                if not skip_sync:
                    state.sync()
                result = func(state, *args, **kwargs)
                # Every live rank must have finished: a rank that returns
                # while another resets would leave it waiting.
                if members.agree(finished=True):
                    _forget_kept_commit()
                    return result
                failed = True
                agreed = True
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
                agreed = False
            except Exception as e:  # noqa: BLE001 (classified just below)
                failed = True
                agreed = False
                if _is_failure(e):
                    print(f"tfring elastic: rank {members.comm.Get_rank()} "
                          f"saw a failure, resetting: {_reason(e)}",
                          file=sys.stderr, flush=True)
                else:
                    # KeyboardInterrupt and SystemExit are no Exception:
                    # they end the rank as before.
                    raised = (e, members.comm.Get_rank())
                    members.raised = True
                    _core.revoke_job()
            if failed:
                members.revoke()
                state.restore()
                skip_sync = False
            _reset(members, agreed, before_reset)
            if members.job_failed:
                _end_with_error(*raised)
            if members.left:
                if members.raised:
                    _leave_after_raising(*raised)
                _leave(members)
            if _refill_to_min_np(members, settings, before_reset):
                skip_sync = False  # started ranks or a rollback need the state
            _check_limits(members, settings)
            state.on_reset()

    return wrapper


def _resume_from_kept_commit(state, members, settings):
    """In a job tfringrun started again after a lost host: every rank's
    state becomes the newest commit that a host left kept on its disk (the
    ranks of the first launch died with their commits in memory)."""
    kept = _kept_commit.for_this_job()
    # A rank started into the running job (resets 1 from its start) gets
    # the state from the others' sync instead.
    if (not settings.restarts or members.resets or kept is None
            or state._snapshot() is None):
        return
    found = kept.read()
    comm = members.comm
    kept_by_rank = comm.allgather((found[0] if found else 0, kept.host))
    numbers = [number for number, _ in kept_by_rank]
    newest = max(numbers)
    if newest == 0:
        if comm.Get_rank() == 0:
            print(f"tfring elastic: no host left kept a commit; the program "
                  f"starts afresh (restart {settings.restarts}).",
                  file=sys.stderr, flush=True)
        return
    holder = numbers.index(newest)
    snapshot = comm.bcast(found[1] if comm.Get_rank() == holder else None,
                          root=holder)
    state._load_snapshot(snapshot)
    state.restore()
    state._commits = newest
    if comm.Get_rank() == 0:
        print(f"tfring elastic: resuming from commit {newest}, kept on host "
              f"{kept_by_rank[holder][1]} (restart {settings.restarts}).",
              file=sys.stderr, flush=True)


def _forget_kept_commit():
    """The job finished: the host's kept commit is of no more use."""
    kept = _kept_commit.for_this_job()
    if kept is not None and _basics.local_rank() == 0:
        kept.remove()


def _leave(members):
    """Ends a rank of a host the discovery script no longer lists: the
    others went on without it, so it exits cleanly (status 0), without
    running the rest of the training script."""
    print(f"tfring elastic: the host discovery script no longer lists host "
          f"{members.host()}; its rank leaves the job, which goes on without "
          "it.", file=sys.stderr, flush=True)
    raise SystemExit(0)


def _leave_after_raising(error, rank):
    """Ends a rank whose training function raised, after the others reset
    without it: it exits cleanly (status 0), so that the job's exit status
    is that of the ranks that go on."""
    traceback.print_exception(error, file=sys.stderr)
    print(f"tfring elastic: rank {rank}'s training function raised "
          f"{_described(error)}; the rank leaves the job, and the others go "
          "on without it from the last commit.", file=sys.stderr, flush=True)
    raise SystemExit(0)


def _end_with_error(error, rank):
    """Ends a rank whose training function raised when every rank left in
    the job raised too: nothing would go on, so the job fails with the
    error, as a job whose ranks all failed does in Horovod."""
    print(f"tfring elastic: rank {rank}'s training function raised "
          f"{_described(error)}, and so did every other rank left in the "
          "job; the job ends with the error.", file=sys.stderr, flush=True)
    raise error


def _described(error):
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _refill_to_min_np(members, settings, before_reset):
    """Waits for discovered slots below --min-np (tfring/elastic/refill.py),
    resetting again when a rank dies during the wait. True when the state
    must be synced: ranks were started, or a rank died meanwhile."""
    rank_died = False
    while True:
        try:
            return _refill.refill_to_min_np(members, settings) or rank_died
        except Exception as e:  # noqa: BLE001
            if not _is_failure(e):
                raise
            print(f"tfring elastic: rank {members.comm.Get_rank()} saw a "
                  f"failure while waiting for free slots, resetting: "
                  f"{_reason(e)}", file=sys.stderr, flush=True)
            members.revoke()
            _reset(members, False, before_reset)
            rank_died = True


def _reset(members, agreed, before_reset):
    """Rebuilds the job over the live ranks, retrying while more ranks
    fail during the rebuild."""
    if before_reset is not None:
        before_reset()
    if not agreed:
        members.agree(finished=False)
    while True:
        try:
            members.rebuild()
            return
        except Exception as e:  # noqa: BLE001
            if not _is_failure(e):
                raise
            # Another rank died during the rebuild: start over the way every
            # other live rank does (revoke, agree, shrink).
            members.revoke()
            members.agree(finished=False)
