# tfringrun's elastic options: Horovod's `--min-np/--max-np/--reset-limit`,
# and what they change in the mpirun command.
#
# Why a module of its own: elastic jobs run Open MPI in its fault-tolerant
# mode (`--with-ft ulfm`: a rank that dies becomes an error on the
# survivors' communicators and PRRTE keeps the job running), move data over
# MPI only (tfring's shared-memory path assumes a fixed set of processes on
# the host), leave MPI's finalisation to PMIx (tfring/elastic/membership.py),
# and tell every rank its limits through TFRING_ELASTIC_* variables
# (tfring/elastic/settings.py).

import os
import secrets
import shutil
import tempfile

from tfring.elastic import blacklist
from tfring.elastic import settings as elastic_settings
from tfring.launcher import hosts as launch_hosts
from tfring.launcher import knobs as launch_knobs

# The variables tfring/elastic/discovery.py and membership.py read (named
# here, not imported: those modules load MPI and the core).
DISCOVERY_SCRIPT = "TFRING_ELASTIC_DISCOVERY_SCRIPT"
DISCOVERY_SLOTS = "TFRING_ELASTIC_SLOTS"
LAUNCH_HOSTS = "TFRING_ELASTIC_HOSTS"
# The core's knob; elastic jobs default it to 0 (see environment()).
HIERARCHICAL = "TFRING_HIERARCHICAL_ALLREDUCE"

# `--with-ft ulfm` makes the launched job recoverable in PRRTE; ranks started
# later (MPI_Comm_spawn, which has no info key for it) form jobs of their
# own, which take PRRTE's default: without state_base_recoverable, a started
# rank that dies makes prterun end with its status (137 after SIGKILL) even
# when the others finish.
FAULT_TOLERANT_RUNTIME = ["--with-ft", "ulfm",
                          "--prtemca", "state_base_recoverable", "1"]


def add_arguments(parser):
    group = parser.add_argument_group(
        "elastic training",
        "ranks that die are dropped and training goes on over the survivors "
        "from the last state.commit() (see docs/elastic.md)")
    group.add_argument(
        "--min-np", "--min-num-proc", dest="min_np", type=int, default=None,
        help="end the job when fewer ranks than this remain (turns on "
             "elastic mode; default: -np)")
    group.add_argument(
        "--max-np", "--max-num-proc", dest="max_np", type=int, default=None,
        help="the most ranks the job may have (turns on elastic mode)")
    group.add_argument(
        "--reset-limit", type=int, default=None,
        help="end the job after more resets than this (default: no limit)")
    group.add_argument(
        "--elastic-timeout", type=float, default=None, metavar="SECONDS",
        help="with --host-discovery-script: how long a job below --min-np "
             "waits for the script to list enough free slots before it ends "
             "(default 600); without a script such a job ends at once")
    group.add_argument(
        "--spawn-timeout", type=float, default=None, metavar="SECONDS",
        help="with --host-discovery-script: how long the ranks wait for "
             "ranks started on discovered slots to join; then they go on "
             "without them and blacklist the host (default "
             f"{elastic_settings.DEFAULT_SPAWN_TIMEOUT_S:g})")
    group.add_argument(
        "--host-discovery-script", default=None,
        help="a program that prints the usable hosts, one `host:slots` per "
             "line; rank 0 runs it every second and the job grows onto new "
             "slots at the next state.commit() (only hosts of -H/--hostfile: "
             "see docs/elastic.md)")
    group.add_argument(
        "--slots", "--slots-per-host", dest="slots", type=int, default=None,
        help="slots of a discovered host listed without `:slots` (default 1)")
    group.add_argument(
        "--elastic-commit-dir", default=None, metavar="DIR",
        help="where the first rank of each host keeps the newest commit "
             "on that host's disk, for a job started again after a lost "
             "host; `none` keeps commits in memory only (default: a new "
             "directory under the temporary directory, removed at the end)")
    group.add_argument(
        "--blacklist-cooldown-range", type=float, nargs=2, default=None,
        metavar=("LO", "HI"),
        help="a host where a rank died gets no new ranks for a cooldown "
             "between LO and HI seconds, growing with each failure there "
             "(default: no new ranks there for the rest of the job)")


def choose_commit_directory(args, environ):
    """Sets args.commit_dir, where each host keeps its newest commit (the
    same for every launch of the job; '' for none), and args.own_commit_dir,
    whether tfringrun made up the name and so removes it at the end."""
    chosen = args.elastic_commit_dir or environ.get(
        elastic_settings.COMMIT_DIR, "").strip()
    args.own_commit_dir = not chosen
    if chosen == "none":
        args.commit_dir = ""
    elif chosen:
        args.commit_dir = os.path.abspath(chosen)
    else:
        args.commit_dir = os.path.join(
            tempfile.gettempdir(),
            f"tfring-elastic-{os.getpid()}-{secrets.token_hex(4)}")


def remove_commit_directory(args):
    """Removes the directory of kept commits that tfringrun named, on this
    host: the job ended and will not start again (the ranks of a job that
    finished removed their hosts' files already)."""
    if getattr(args, "own_commit_dir", False):  # set for elastic jobs only
        shutil.rmtree(args.commit_dir, ignore_errors=True)


def one_host_transport(args):
    """Open MPI's transport for an elastic job on one host: shared memory,
    and TCP (over loopback) too when ranks may be started into the job: a
    started rank belongs to another MPI job, which shared memory does not
    reach."""
    btl = "self,sm,tcp" if args.host_discovery_script else "self,sm"
    return ["--mca", "pml", "ob1", "--mca", "btl", btl]


def enabled(args):
    return any(getattr(args, name, None) is not None for name in
               ("min_np", "max_np", "reset_limit", "elastic_timeout",
                "host_discovery_script"))


def check(args):
    """Raises ValueError naming the problem with the elastic options."""
    if getattr(args, "blacklist_cooldown_range", None) is not None:
        if not getattr(args, "host_discovery_script", None):
            raise ValueError(
                "--blacklist-cooldown-range applies to hosts found by "
                "--host-discovery-script, but no script was given. Expected "
                "both or neither. Add --host-discovery-script SCRIPT, or "
                "remove --blacklist-cooldown-range.")
        blacklist.check_cooldown_range(*args.blacklist_cooldown_range)
    if getattr(args, "slots", None) is not None and not getattr(
            args, "host_discovery_script", None):
        raise ValueError(
            "--slots applies to hosts found by --host-discovery-script, but "
            "no script was given. Expected both or neither. Add "
            "--host-discovery-script SCRIPT, or remove --slots.")
    spawn_timeout = getattr(args, "spawn_timeout", None)
    if spawn_timeout is not None and not 0 < spawn_timeout < float("inf"):
        raise ValueError(
            f"--spawn-timeout {spawn_timeout:g} is not a positive number of "
            "seconds. Expected e.g. 120. Fix the number.")
    elastic_timeout = getattr(args, "elastic_timeout", None)
    if elastic_timeout is not None and not 0 <= elastic_timeout < float("inf"):
        raise ValueError(
            f"--elastic-timeout {elastic_timeout:g} is not a non-negative "
            "number of seconds. Expected e.g. 600, or 0 to end a job below "
            "--min-np at once. Fix the number.")
    if not enabled(args):
        return
    np = args.num_proc
    min_np = args.min_np if args.min_np is not None else np
    max_np = args.max_np if args.max_np is not None else np
    if np is not None and not (1 <= min_np <= np <= max_np):
        raise ValueError(
            f"--min-np {min_np}, -np {np} and --max-np {max_np} are out of "
            "order. Expected 1 <= --min-np <= -np <= --max-np. Fix the "
            "numbers.")
    if args.reset_limit is not None and args.reset_limit < 0:
        raise ValueError(
            f"--reset-limit {args.reset_limit} is negative. Expected 0 "
            "(no limit) or more. Fix the number.")


def variables(args):
    """{name: value} of the variables that tell every rank it runs elastic,
    and its limits (passed with `mpirun -x`)."""
    np = args.num_proc
    values = {
        elastic_settings.ELASTIC: "1",
        elastic_settings.MIN_NP: args.min_np if args.min_np is not None else np,
        elastic_settings.MAX_NP: args.max_np if args.max_np is not None else np,
        elastic_settings.RESET_LIMIT: args.reset_limit or 0,
        # Shared memory assumes every rank of the host stays (elastic:
        # MPI only), and MPI_Finalize would wait for dead ranks.
        "TFRING_SHM": "0",
        "MPI4PY_RC_FINALIZE": "0",
    }
    # Flat allreduces unless asked otherwise: a rank waiting on its
    # cross-host peer would not learn that the peer's host-mate failed
    # inside that host.
    if (HIERARCHICAL not in os.environ
            and HIERARCHICAL not in launch_knobs.settings(args)):
        values[HIERARCHICAL] = "0"
    if args.elastic_timeout is not None:
        values[elastic_settings.TIMEOUT] = args.elastic_timeout
    if getattr(args, "spawn_timeout", None) is not None:
        values[elastic_settings.SPAWN_TIMEOUT] = args.spawn_timeout
    if getattr(args, "restarts", 0):
        values[elastic_settings.RESTARTS] = args.restarts
    if hasattr(args, "commit_dir"):
        values[elastic_settings.COMMIT_DIR] = args.commit_dir
    if args.host_discovery_script is not None:
        values[DISCOVERY_SCRIPT] = os.path.abspath(args.host_discovery_script)
        values[DISCOVERY_SLOTS] = args.slots or 1
        if args.blacklist_cooldown_range is not None:
            values[blacklist.COOLDOWN] = ",".join(
                f"{limit:g}" for limit in args.blacklist_cooldown_range)
        values[LAUNCH_HOSTS] = launch_hosts.format_host_list(
            args.host_entries) or f"localhost:{args.num_proc}"
    return values
