# A job that reports the settings tfring read, for
# tests/test_environment_jobs.py: `environment_job.py torch|tensorflow`.
#
# Each rank initialises the chosen front end, prints its configuration as
# tfring._core.config() lists it (value and the variable it was read from)
# and the sum of an allreduce (through shared memory at 2 ranks on one host),
# then, with HOROVOD_DYNAMIC_PROCESS_SETS set, adds a process set after init
# and reduces within it as Horovod's process-set tests do. It then shuts
# down and initialises again (a job may restart tfring; the warnings about
# the environment still come once).
import json
import os
import sys

front_end = sys.argv[1]
if front_end == "torch":
    import torch
    import tfring.torch as hvd

    def ones(n):
        return torch.ones(n)

    def total(tensor):
        return float(tensor.sum())
else:
    import tensorflow as tf
    import tfring as hvd

    def ones(n):
        return tf.ones([n])

    def total(tensor):
        return float(tf.reduce_sum(tensor))

from tfring import _core, basics  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
config = {e["env"]: {"value": e["value"], "set_by": e["set_by"]} for e in _core.config()}
reduced = hvd.allreduce(ones(100000), op=hvd.Sum, name="environment_job.ones")
report = {"config": config, "sum": total(reduced), "data_path": basics.data_path()}

if os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS"):
    if size == 1:
        # The only set there is, the global one: refused as a duplicate,
        # not for want of dynamic process sets.
        try:
            hvd.add_process_set([0])
            report["dynamic"] = "added a duplicate of the global set"
        except ValueError as e:
            report["dynamic"] = str(e)
    else:
        evens = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
        odds = hvd.add_process_set([r for r in range(size) if r % 2 == 1])
        mine = evens if evens.included() else odds
        in_set = hvd.allreduce(ones(3), op=hvd.Sum, name="environment_job.set",
                               process_set=mine)
        report["dynamic"] = {"set": mine.ranks, "sum": total(in_set),
                             "removed": [hvd.remove_process_set(odds),
                                         hvd.remove_process_set(evens)]}

print(f"REPORT {rank} {json.dumps(report)}", flush=True)
hvd.shutdown()
hvd.init()
print(f"RESTARTED {hvd.rank()}", flush=True)
hvd.shutdown()
