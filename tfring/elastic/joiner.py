# The entry point of a rank started into a running elastic job.
#
# Why: MPI_Comm_spawn starts a program with arguments but not the launch's
# environment (the -x variables stay with the first ranks), and the new rank
# must run the same training script as the others. The starting ranks pass
# their TFRING_*/TF_*/... variables as JSON; this sets them, merges this
# process's communicator with the running ranks' (tfring/elastic/
# membership.py) and runs the script as __main__, whose tfring.init() then
# starts on the merged communicator. Joining is bounded by the spawn
# timeout, as the starting ranks' wait is (tfring/elastic/bounded_spawn.py):
# when they gave up, this process would wait for them forever (in MPI's
# start, or in the merge), and keep the job from ending.
#
# Usage (by membership.py only): python -m tfring.elastic.joiner ENV_JSON SCRIPT ARGS...

import json
import os
import runpy
import sys
import threading


def _join_timeout(timeout_s):
    """The message of a started rank that gives up (an error object, so
    that the troubleshooting page's check finds it)."""
    return TimeoutError(
        f"tfring elastic: this rank, started into the running job on host "
        f"{os.environ.get('TFRING_ELASTIC_HOST')}, could not join it within "
        f"{timeout_s:g} s (--spawn-timeout). Expected the ranks that started "
        "it to merge with it; they go on without it, and it exits with "
        "status 0. Their output says why the start failed; on a loaded host "
        "raise --spawn-timeout.")


def _give_up(timeout_s):
    # Exit status 0: Open MPI's runtime ends a job with status 1 when any of
    # its processes did, and the job goes on well without this one.
    print(str(_join_timeout(timeout_s)), file=sys.stderr, flush=True)
    os._exit(0)


def main():
    os.environ.update(json.loads(sys.argv[1]))
    sys.argv = sys.argv[2:]
    from tfring.elastic import settings
    timeout_s = settings.from_environment().spawn_timeout_s
    watchdog = threading.Timer(timeout_s, _give_up, args=(timeout_s,))
    watchdog.daemon = True
    watchdog.start()
    # After the environment: mpi4py reads MPI4PY_RC_* when imported.
    from tfring.elastic import membership
    membership.current().initial_communicator()
    watchdog.cancel()
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
