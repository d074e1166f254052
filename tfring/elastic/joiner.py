# The entry point of a rank started into a running elastic job.
#
# Why: MPI_Comm_spawn starts a program with arguments but not the launch's
# environment (the -x variables stay with the first ranks), and the new rank
# must run the same training script as the others. The starting ranks pass
# their TFRING_*/TF_*/... variables as JSON; this sets them, merges this
# process's communicator with the running ranks' (tfring/elastic/
# membership.py) and runs the script as __main__, whose tfring.init() then
# starts on the merged communicator.
#
# Usage (by membership.py only): python -m tfring.elastic.joiner ENV_JSON SCRIPT ARGS...

import json
import os
import runpy
import sys


def main():
    os.environ.update(json.loads(sys.argv[1]))
    sys.argv = sys.argv[2:]
    # After the environment: mpi4py reads MPI4PY_RC_* when imported.
    from tfring.elastic import membership
    membership.current().initial_communicator()
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
