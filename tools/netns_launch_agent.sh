#!/bin/sh
# PRRTE's "ssh" for the namespace hosts of tools/netns_hosts.py.
#
# Why: Open MPI starts its daemon on every other host by running
#   <plm_ssh_agent> HOST 'COMMAND LINE'
# (ssh by default). Here a host is a set of namespaces on this machine, so
# this script, instead of ssh, enters HOST's namespaces through its holder
# process (whose pid the harness wrote to DIR/HOST.pid) and runs the
# command line with a shell, as sshd would. Like ssh it does not pass the
# caller's environment on: the command starts with a login-like one, so
# whatever the ranks need must be forwarded by mpirun (-x). The exception
# is TFRING_LAUNCH_TAG, which tests/mpi_launch.py uses to find and end
# every process of a launch (ssh's SendEnv would pass it the same way).
#
# Usage: PRTE_MCA_plm_ssh_agent="netns_launch_agent.sh DIR" mpirun -H ...
set -u
if [ $# -lt 3 ]; then
    echo "usage: $0 DIR HOST COMMAND..." >&2
    exit 255
fi
dir=$1
host=$2
shift 2
if [ ! -r "$dir/$host.pid" ]; then
    echo "$0: no test host named '$host' (hosts: $(cd "$dir" && ls *.pid 2>/dev/null | sed 's/\.pid$//' | tr '\n' ' '))" >&2
    exit 255
fi
exec nsenter -t "$(cat "$dir/$host.pid")" --net --uts --mount -- \
    env -i HOME="${HOME:-/root}" USER="$(id -un)" LANG="${LANG:-C.UTF-8}" \
    PATH=/usr/local/bin:/usr/bin:/bin SHELL=/bin/sh \
    ${TFRING_LAUNCH_TAG:+TFRING_LAUNCH_TAG="$TFRING_LAUNCH_TAG"} \
    /bin/sh -c "$*"
