# Decides whether an elastic job that PRRTE ended because it lost a host's
# daemon (daemon_loss.py) starts again on the hosts that are left, and with
# which arguments.
#
# Why a restart and not a recovery: elastic mode keeps the surviving ranks
# and their memory when ranks die, but PRRTE 3.0 ends every rank when it
# loses a daemon, and Open MPI 5.0 offers no way around it
# (docs/elastic.md, "Why tfring cannot keep a job alive past a daemon's
# death"). Starting the job again on the other hosts is what torchrun does
# on every failure, but from the last commit rather than the user's last
# checkpoint: the program starts afresh and tfring.elastic.run resumes from
# the newest commit a host left kept on its disk
# (tfring/elastic/kept_commit.py); its ranks see TFRING_ELASTIC_RESTARTS,
# the number of such restarts so far. A restart counts as one reset against
# --reset-limit, and it needs --min-np slots on the hosts left.

import copy

from tfring.elastic.settings import RESTARTS
from tfring.launcher import elastic as launch_elastic
from tfring.launcher import hosts as launch_hosts
from tfring.launcher.command import RunnerError


def _same_host(listed, reported):
    """Whether `listed` (from -H or the hostfile) is the host PRRTE named:
    the same name, or the same short name (node1 and node1.cluster)."""
    return (listed == reported
            or listed.split(".", 1)[0] == reported.split(".", 1)[0])


def without_lost_host(args, lost_host):
    """The arguments of the next launch, on the hosts of `args` other than
    `lost_host` (`args.restarts`: the restarts so far, absent at first);
    raises RunnerError saying why the job does not start again (not
    elastic, an unknown host, --reset-limit, too few slots)."""
    restarts_done = getattr(args, "restarts", 0)
    if not launch_elastic.enabled(args):
        raise RunnerError(
            "only elastic jobs (--min-np, --max-np, ...) are started again "
            "after a lost host")
    if lost_host is None:
        raise RunnerError("PRRTE's message named no host to leave out")
    left = [host for host in args.host_entries
            if not _same_host(host.name, lost_host)]
    if len(left) == len(args.host_entries):
        raise RunnerError(
            f"host {lost_host} is not among the job's hosts (-H/--hostfile)")
    if args.reset_limit and restarts_done >= args.reset_limit:
        raise RunnerError(
            f"a restart would be more resets than --reset-limit "
            f"{args.reset_limit}")
    slots = sum(host.slots or 1 for host in left)
    min_np = args.min_np if args.min_np is not None else args.num_proc
    if slots < min_np:
        raise RunnerError(
            f"the hosts left have {slots} slot(s), fewer than --min-np "
            f"{min_np}")
    restarted = copy.copy(args)
    restarted.host_entries = left
    restarted.hosts = launch_hosts.format_host_list(left)
    restarted.hostfile = None
    restarted.num_proc = min(args.num_proc, slots)
    restarted.min_np = min_np
    restarted.max_np = (args.max_np if args.max_np is not None
                        else args.num_proc)
    restarted.restarts = restarts_done + 1
    return restarted


def notice(lost_host, args):
    """What tfringrun prints before it starts the job again."""
    return (f"tfringrun: starting the job again without host {lost_host}, "
            f"at {args.num_proc} ranks on {args.hosts} (restart "
            f"{args.restarts}; the program starts afresh and "
            f"tfring.elastic.run resumes from {_resumes_from(args)}; its "
            f"ranks see {RESTARTS}={args.restarts}).")


def _resumes_from(args):
    if getattr(args, "commit_dir", ""):
        return "the newest commit a host left kept on its disk"
    return "the program's start (--elastic-commit-dir none)"
