# Waiting for discovered slots when an elastic job is below --min-np.
#
# Why: after ranks die or leave, the job may hold fewer ranks than
# --min-np. Without a discovery script no rank can join, so the job ends at
# once; with one, the survivors wait up to --elastic-timeout seconds (as
# Horovod's driver does) for the script to list enough free slots, start
# ranks on them and go on. Rank 0 reads the listing and decides; every
# survivor receives each decision, so all of them wait, start or give up
# together.

import time

from tfring.elastic import discovery


def refill_to_min_np(members, settings):
    """Starts ranks on discovered slots until the job has settings.min_np
    ranks, waiting up to settings.timeout_s for the script to list them.
    Returns True when ranks were started (the new ones need the state);
    False when none were needed, or the wait ran out (the caller's limit
    check then ends the job). Collective over the job's ranks."""
    if members.comm.Get_size() >= settings.min_np or not discovery.enabled():
        return False
    deadline = time.monotonic() + settings.timeout_s
    interval_s = discovery.interval_s()
    while True:
        decision = None
        if members.comm.Get_rank() == 0:
            decision = _decide(members, settings, deadline)
        plan, expired = members.comm.bcast(decision, root=0)
        if plan:
            members.growth = plan
            members.rebuild()
            return True
        if expired:
            return False
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
