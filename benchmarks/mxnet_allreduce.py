"""tfring.mxnet against MXNet's own parameter server (kvstore 'dist_sync'),
raw MPI and tfring's TensorFlow path, on 2 processes of this machine.

    .venv-mxnet/bin/python benchmarks/mxnet_allreduce.py [--repeats 20] [--steps 200]

Run it with the MXNet environment's Python, not under mpirun: it starts
three jobs one after another (benchmarks/_mxnet_workers.py does the timed
work) and prints one table.

  1. tfring.mxnet: `mpirun -np 2` in the MXNet environment. One float32
     NDArray of 4 KiB, 256 KiB, 4 MiB and 64 MiB summed: allreduce_ (in
     place) and allreduce (a new output), against mpi4py Allreduce in
     place and src->dst in the same processes, interleaved. Then a Gluon
     training step (a small CNN, batches of 32 and 128 28x28 images per
     rank) with DistributedTrainer; with a variant of it that pushes the
     allreduce into MXNet's engine instead of waiting for the gradients
     (the other way of ordering with the engine); with a trainer that only
     meets the other rank at a barrier each step (what synchronising alone
     costs: no synchronous step can beat it); and without any
     communication (the ceiling: both ranks train on their own at once);
     taking turns 3 times.
  2. kvstore('dist_sync'): a scheduler, one server and two workers, each a
     process with its DMLC_* role. The same arrays pushed and pulled (the
     workers' sum comes back: an allreduce). Then the same Gluon step
     with a gluon.Trainer on this kvstore, interleaved 3 times with its
     own ceiling.
  3. tfring's TensorFlow path: `mpirun -np 2` with the main environment's
     Python (.venv, which has TensorFlow): hvd.allreduce of the same sizes,
     eager. The TensorFlow row is the reference of the goal "tfring.mxnet
     within 10% of the TensorFlow path on the same core".

Times are the slowest rank's per repetition; medians are printed.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKERS = str(HERE / "_mxnet_workers.py")
SIZES = [4 * 1024, 256 * 1024, 4 * 1024 * 1024, 64 * 1024 * 1024]
TIMEOUT_S = 900


def quiet_env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1",
               TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1",
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONWARNINGS="ignore")
    env.update(extra)
    return env


def result_of(output, what):
    lines = [l for l in output.splitlines() if l.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"{what} printed no result:\n{output[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def mpirun(python, args, env):
    mpirun_path = Path(python).parent / "mpirun"
    command = [str(mpirun_path), "-np", "2", "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    done = subprocess.run(command + [python, WORKERS, *args], env=env, cwd=str(REPO),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    return done.stdout + done.stderr


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def kvstore_job(args):
    common = dict(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()),
                  DMLC_NUM_SERVER="1", DMLC_NUM_WORKER="2",
                  DMLC_INTERFACE="lo")  # ps-lite on the loopback: one machine
    started = []
    try:
        for role in ("scheduler", "server"):
            started.append(subprocess.Popen(
                [sys.executable, "-c", "import mxnet"], env=quiet_env(DMLC_ROLE=role, **common),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        workers = [subprocess.Popen(
            [sys.executable, WORKERS, "kvstore", *args], env=quiet_env(DMLC_ROLE="worker", **common),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(2)]
        started += workers
        output = "".join(w.communicate(timeout=TIMEOUT_S)[0] for w in workers)
        return output
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200,
                        help="images per training measurement, in batches of 32 (default 200)")
    parser.add_argument("--tf-python", default=str(REPO / ".venv" / "bin" / "python"),
                        help="a Python with TensorFlow and tfring built for it")
    args = parser.parse_args()
    work = [str(args.repeats), str(args.steps)]
    tfring_run = result_of(mpirun(sys.executable, ["tfring", *work], quiet_env()), "tfring.mxnet")
    kvstore_run = result_of(kvstore_job(work), "kvstore")
    tf_run = result_of(mpirun(args.tf_python, ["tf", *work],
                              quiet_env(PYTHONPATH=str(REPO))), "TensorFlow")
    times = {**tfring_run["times"], **kvstore_run["times"], **tf_run["times"]}

    def ms(label):
        return np.median(times[label]) * 1e3

    print("allreduce of one float32 array, 2 ranks (median ms, slowest rank)")
    columns = ["tfring.mxnet in place", "tfring.mxnet new output", "tfring TensorFlow",
               "mpi4py in place", "mpi4py src->dst", "kvstore push+pull"]
    print(f"{'size':>8} " + " ".join(f"{c:>24}" for c in columns) + f" {'mxnet/TF':>9}")
    for size in SIZES:
        name = f"{size // 1024} KiB" if size < 1 << 20 else f"{size >> 20} MiB"
        row = [ms(f"{c} {size}") for c in columns]
        print(f"{name:>8} " + " ".join(f"{v:24.3f}" for v in row)
              + f" {row[1] / row[2]:9.2f}")
    for batch in (32, 128):
        print(f"\nGluon training step, small CNN, batch {batch} of 28x28 per rank (img/s over 2 "
              "ranks, medians; each ratio is to the ceiling its job measured, interleaved)")
        for run, names in ((tfring_run, ("barrier only", "tfring", "tfring engine push")),
                           (kvstore_run, ("kvstore",))):
            ceiling = np.median(run["rates"][f"ceiling {batch}"])
            for name in names:
                rate = np.median(run["rates"][f"{name} {batch}"])
                print(f"{name:>20}: {rate:8.0f} img/s, {rate / ceiling:.2f} of its job's "
                      f"ceiling ({ceiling:.0f} img/s)")

if __name__ == "__main__":
    main()
