# Waiting for discovered slots when an elastic job is below --min-np.
#
# Why: after ranks die or leave, the job may hold fewer ranks than
# --min-np. Without a discovery script no rank can join, so the job ends at
# once; with one, the survivors wait up to --elastic-timeout seconds (as
# Horovod's driver does) for the script to list enough free slots, start
# ranks on them and go on. Rank 0 reads the listing and decides; every
# survivor receives each decision, and all of them agree (fault-tolerantly)
# that every one received it, so they wait, start or give up together, and
# a rank that dies during the wait turns into one more reset, never a hang.

import sys
import time

from tfring.elastic import discovery
from tfring.elastic import membership
from tfring.elastic.errors import InternalError


def refill_to_min_np(members, settings):
    """Starts ranks on discovered slots until the job has settings.min_np
    ranks, waiting up to settings.timeout_s for the script to list them.
    Returns True when ranks were started, or a start failed (the job was
    rebuilt: the state is synced again); False when none were needed, or
    the wait ran out (the caller's limit check then ends the job). Raises
    InternalError on every waiting rank when one of them died during the
    wait (the caller resets and calls it again). Collective over the job's
    ranks."""
    if members.comm.Get_size() >= settings.min_np or not discovery.enabled():
        return False
    deadline = time.monotonic() + settings.timeout_s
    interval_s = discovery.interval_s()
    announced = False
    rebuilt = False
    while True:
        decision = None
        if members.comm.Get_rank() == 0:
            decision = _decide(members, settings, deadline)
            if decision[0] is None and not announced:
                _announce_wait(members, settings)
                announced = True
        plan, expired = _share(members, decision)
        if plan:
            members.growth = plan
            members.rebuild()
            rebuilt = True
            if members.comm.Get_size() >= settings.min_np:
                return True
            # The start failed (tfring/elastic/bounded_spawn.py) and its
            # hosts are blacklisted now: wait for other slots.
            continue
        if expired:
            return rebuilt
        time.sleep(interval_s)


def _decide(members, settings, deadline):
    """Rank 0's (plan, expired): a plan when the listing has enough free
    slots to reach min_np, else None."""
    hosts = discovery.poller().hosts()
    plan = []
    if hosts is not None:
        plan = discovery.growth_plan(members.blacklist.usable(hosts),
                                     members.ranks_per_host(),
                                     members.comm.Get_size(), settings.max_np)
    size = members.comm.Get_size() + sum(count for _, count in plan)
    if size >= settings.min_np:
        return plan, False
    return None, time.monotonic() >= deadline


def _share(members, decision):
    """Rank 0's decision on every waiting rank, once all of them agree that
    each received it and none died."""
    try:
        decision = members.comm.bcast(decision, root=0)
        received = True
    except Exception as e:  # noqa: BLE001 (an MPI failure, checked below)
        if not membership.is_process_failure(e):
            raise
        received = False
    if not members.agree(finished=received):
        size = members.comm.Get_size()
        raise InternalError(
            f"tfring elastic: a rank died while the {size} ranks of the job "
            "waited for the host discovery script to list free slots "
            "(--elastic-timeout). Expected the waiting ranks to stay up; the "
            "run loop resets the job over the live ranks and waits again. "
            "The dead rank's output, or Open MPI's, names the cause.")
    return decision


def _announce_wait(members, settings):
    size = members.comm.Get_size()
    print(f"tfring elastic: {size} ranks are left, fewer than the minimum "
          f"{settings.min_np} (--min-np); waiting up to "
          f"{settings.timeout_s:g} s (--elastic-timeout) for the host "
          f"discovery script to list {settings.min_np - size} more usable "
          "free slots.", file=sys.stderr, flush=True)
