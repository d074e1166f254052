# What `tfringrun --check-build` and `--check-hosts` run on the ranks.
#
# Why a module of its own: these functions run in processes that mpirun
# starts (on this machine or on the job's hosts), with the job's Python and
# environment, and report what they find as one JSON line each, which
# tfring/launcher/checks.py reads back from mpirun's output:
#
#   python -m tfring.launcher.probes allreduce        # on each of 2 ranks
#   python -m tfring.launcher.probes torch-allreduce  # the same, tfring.torch
#   python -c HOST_REPORT_CODE NAME                 # one process per host
#
# The host report starts through HOST_REPORT_CODE rather than `-m`: on a
# host whose TensorFlow or tfring does not import, `-m` would die before it
# could report, and that host is exactly what --check-hosts has to explain.

import json
import os
import platform
import socket
import sys
import traceback

# Marks a probe's report among everything else the job prints.
REPORT_MARK = "TFRING_PROBE_REPORT "

# `python -c HOST_REPORT_CODE NAME`: prints host_report(NAME), or, when
# tfring's modules do not import there, a report that carries the error and
# whichever versions could still be read.
HOST_REPORT_CODE = f"""\
import json, platform, sys
try:
    from tfring.launcher import probes as launch_probes
except Exception as e:
    report = dict(given_name=sys.argv[1], python=platform.python_version(),
                  executable=sys.executable,
                  error=f"{{type(e).__name__}}: {{e}}")
    try:
        import tensorflow
        report["tensorflow"] = tensorflow.__version__
        import tfring
        report["tfring"] = getattr(tfring, "__version__", "without a version")
    except Exception:
        pass
    print({REPORT_MARK!r} + json.dumps(report), flush=True)
    sys.exit(1)
sys.exit(launch_probes.main(["host-report", sys.argv[1]]))
"""


def _emit(report):
    sys.stdout.write(REPORT_MARK + json.dumps(report, sort_keys=True) + "\n")
    sys.stdout.flush()


def _launch_rank():
    """This process's rank as mpirun numbered it (no MPI needed)."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def _error_text(error):
    return f"{type(error).__name__}: {error}"


def host_report(given_name):
    """The versions a job depends on, as found in this process.

    given_name: the host name as the user wrote it (mpirun merges names that
    mean one machine, such as localhost and its hostname, so the process
    could not tell it otherwise)."""
    report = {
        "given_name": given_name,
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "interfaces": sorted(name for _, name in socket.if_nameindex()),
        "tensorflow": None,
        "tfring": None,
        "error": None,
    }
    try:
        import tensorflow
        report["tensorflow"] = tensorflow.__version__
        # Imports the op library too, which checks it matches TensorFlow.
        import tfring
        report["tfring"] = tfring.__version__
    except Exception as e:  # Reported to the launcher, which explains it.
        report["error"] = _error_text(e)
    return report


_THREAD_LEVELS = ("MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED",
                  "MPI_THREAD_SERIALIZED", "MPI_THREAD_MULTIPLE")


def allreduce_values(rank):
    """What rank `rank` contributes: float32 and int32 tensors of 2."""
    return [float(rank + 1), 10.0 * (rank + 1)], [rank + 1, -(rank + 1)]


def expected_sums(size):
    """The Sum allreduce of allreduce_values over `size` ranks."""
    total = size * (size + 1) // 2
    return [float(total), 10.0 * total], [total, -total]


def allreduce_probe():
    """Starts tfring, runs a Sum allreduce of float32 and of int32 values,
    and reports the results and what MPI and tfring said about themselves."""
    report = {"hostname": socket.gethostname(),
              "launch_rank": _launch_rank(), "error": None}
    try:
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        import tfring
        from tfring import _core

        tfring.init()  # Starts MPI through mpi4py, as a training script does.
        import mpi4py
        from mpi4py import MPI
        # Open MPI ends the text with a NUL.
        report["mpi_library"] = MPI.Get_library_version().strip("\0 \n")
        report["mpi4py"] = mpi4py.__version__
        report["thread_level"] = _THREAD_LEVELS[MPI.Query_thread()]
        rank, size = tfring.rank(), tfring.size()
        report.update(rank=rank, size=size, local_size=tfring.local_size(),
                      shm=tfring.shm_enabled(),
                      nccl=tfring.nccl_built())
        report["config"] = {entry["env"]: entry["value"]
                            for entry in _core.config()}
        floats, ints = allreduce_values(rank)
        report["float_sum"] = tfring.allreduce(
            tf.constant(floats, tf.float32), op=tfring.Sum,
            name="tfringrun_check.float").numpy().tolist()
        report["int_sum"] = tfring.allreduce(
            tf.constant(ints, tf.int32), op=tfring.Sum,
            name="tfringrun_check.int").numpy().tolist()
        tfring.shutdown()
    except Exception as e:  # Reported to the launcher, which explains it.
        report["error"] = _error_text(e)
        report["traceback"] = traceback.format_exc()
    return report


def torch_allreduce_probe():
    """Starts tfring.torch (without TensorFlow: a process that has both
    loaded can crash in some torch releases), runs a Sum allreduce of
    float32 and of int32 tensors and reports the results and torch's
    version."""
    report = {"hostname": socket.gethostname(),
              "launch_rank": _launch_rank(), "error": None}
    try:
        import torch
        torch.set_num_threads(1)
        report["torch"] = torch.__version__
        import tfring.torch as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        report.update(rank=rank, size=size)
        floats, ints = allreduce_values(rank)
        report["float_sum"] = hvd.allreduce(
            torch.tensor(floats, dtype=torch.float32), op=hvd.Sum,
            name="tfringrun_check.torch.float").tolist()
        report["int_sum"] = hvd.allreduce(
            torch.tensor(ints, dtype=torch.int32), op=hvd.Sum,
            name="tfringrun_check.torch.int").tolist()
        hvd.shutdown()
    except Exception as e:  # Reported to the launcher, which explains it.
        report["error"] = _error_text(e)
        report["traceback"] = traceback.format_exc()
    return report


_USAGE = ("usage: python -m tfring.launcher.probes allreduce\n"
          "       python -m tfring.launcher.probes torch-allreduce\n"
          "       python -m tfring.launcher.probes host-report HOST_NAME\n")


def main(argv):
    if argv == ["allreduce"]:
        report = allreduce_probe()
    elif argv == ["torch-allreduce"]:
        report = torch_allreduce_probe()
    elif len(argv) == 2 and argv[0] == "host-report":
        report = host_report(argv[1])
    else:
        sys.stderr.write(_USAGE)
        return 2
    _emit(report)
    return 1 if report["error"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
