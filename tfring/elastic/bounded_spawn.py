# Starting ranks into a running elastic job, within a time limit.
#
# Why: MPI_Comm_spawn blocks every rank of the communicator until the new
# processes have joined, and nothing in MPI bounds that wait. A spawn that
# fails inside PRRTE (its daemon reporting `PMIX ERROR ...
# pmix_server_dyn.c` and crashing), or a started process that dies before
# it joins, would leave the asking ranks waiting forever. So the spawn and
# the merge with the new ranks run on a thread of their own, while the
# main thread waits at most the spawn timeout. Rank 0 (the spawn's root)
# then tells the others whether its side finished; all of them agree, with
# ULFM's fault-tolerant agreement, whether the spawn succeeded on every
# one. Both travel on a duplicate of the communicator, since the original
# may still be inside the spawn. When the spawn failed, the ranks revoke
# the original (ranks still waiting inside it return) and the merged one
# where it exists (started ranks that did join then fail out), and go on
# over the duplicate. A thread stuck in PRRTE stays stuck: it is a daemon
# thread, and the process ends without waiting for it.

import threading


def _mpi():
    from mpi4py import MPI
    return MPI


def spawn_and_merge(comm, commands, argvs, counts, infos, timeout_s):
    """MPI_Comm_spawn_multiple over `comm` (root 0), merged with the started
    ranks after those of `comm`. Returns (merged, None) when every rank of
    `comm` finished within timeout_s, else (a communicator of the ranks of
    `comm`, the reason as text: rank 0's, or another rank's failure).
    Collective over
    `comm`; a rank of `comm` that dies meanwhile raises MPI's error."""
    MPI = _mpi()
    guard = comm.Dup()
    guard.Set_errhandler(MPI.ERRORS_RETURN)
    outcome = {}
    finished = threading.Event()

    def spawn():
        try:
            started = comm.Spawn_multiple(commands, argvs, counts, infos,
                                          root=0)
            outcome["merged"] = started.Merge(high=False)
        except Exception as e:  # noqa: BLE001 (reported to every rank)
            outcome["error"] = e
        finally:
            finished.set()

    threading.Thread(target=spawn, daemon=True,
                     name="tfring-elastic-spawn").start()
    reason = None
    if guard.Get_rank() == 0:
        reason = _outcome(finished.wait(timeout_s), outcome, timeout_s)
    # The root's reason ends the others' wait at once when it failed; when it
    # succeeded, theirs follows within moments (they only merge).
    reason = guard.bcast(reason, root=0)
    if reason is None and guard.Get_rank() != 0:
        reason = _outcome(finished.wait(timeout_s), outcome, timeout_s)
    succeeded = bool(guard.Agree(1 if reason is None else 0))
    if succeeded:
        guard.Free()
        return outcome["merged"], None
    if reason is None:
        reason = "another rank's part of the spawn failed or timed out"
    for failed in (outcome.get("merged"), comm):
        if failed is not None:
            try:
                failed.Revoke()
            except MPI.Exception:
                pass  # already revoked
    return guard, reason


def _outcome(done, outcome, timeout_s):
    """None when this rank's part of the spawn finished well, else why not."""
    if not done:
        return (f"MPI_Comm_spawn did not finish within {timeout_s:g} s "
                "(TFRING_ELASTIC_SPAWN_TIMEOUT, tfringrun --spawn-timeout)")
    if "error" in outcome:
        return f"MPI_Comm_spawn failed ({outcome['error']})"
    return None
