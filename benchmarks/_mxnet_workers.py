"""The timed work of benchmarks/mxnet_allreduce.py, one process per rank.

    _mxnet_workers.py tfring   under mpirun, MXNet's environment: tfring.mxnet
                               allreduce (in place and new output) and mpi4py
                               Allreduce; a Gluon step with DistributedTrainer
                               and without communication (the ceiling)
    _mxnet_workers.py kvstore  as a DMLC worker of kvstore('dist_sync'): push
                               and pull of the same sizes
    _mxnet_workers.py tf       under mpirun, the main environment: tfring's
                               TensorFlow allreduce of the same sizes

Each prints one line "RESULT <json>" on its first rank: {case: seconds[]}
for the collectives (medians taken by the caller), {variant: img/s} for the
training step.
"""

import json
import sys
import time

import numpy as np

SIZES = [4 * 1024, 256 * 1024, 4 * 1024 * 1024, 64 * 1024 * 1024]
BATCH = 32


def timed(fn, repeats, barrier):
    for _ in range(2):
        barrier()
        fn()
    times = []
    for _ in range(repeats):
        barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def gluon_step_rate(trainer_factory, steps, barrier, ranks):
    """Images per second over all ranks of a small CNN's training step."""
    import mxnet as mx
    from mxnet import autograd, gluon
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(32, 3, activation="relu"), gluon.nn.MaxPool2D(),
            gluon.nn.Conv2D(64, 3, activation="relu"), gluon.nn.MaxPool2D(),
            gluon.nn.Flatten(), gluon.nn.Dense(128, activation="relu"), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    data = mx.nd.random.uniform(shape=(BATCH, 1, 28, 28))
    label = mx.nd.array(np.random.RandomState(0).randint(0, 10, BATCH))
    net(data)
    trainer = trainer_factory(net.collect_params())
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def step():
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(BATCH)
        mx.nd.waitall()

    for _ in range(3):
        step()
    barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    barrier()
    return ranks * BATCH * steps / (time.perf_counter() - start)


def run_tfring(repeats, steps):
    import mxnet as mx
    from mpi4py import MPI
    import tfring.mxnet as hvd
    hvd.init()
    comm = MPI.COMM_WORLD
    results = {}
    for size in SIZES:
        count = size // 4
        array = mx.nd.ones((count,))
        host = np.ones(count, dtype=np.float32)
        out = np.empty_like(host)
        label = f"{size}"
        results[f"tfring.mxnet in place {label}"] = timed(
            lambda: hvd.allreduce_(array, op=hvd.Sum, name=f"inplace{label}"), repeats,
            comm.Barrier)
        results[f"tfring.mxnet new output {label}"] = timed(
            lambda: hvd.allreduce(array, op=hvd.Sum, name=f"new{label}"), repeats,
            comm.Barrier)
        results[f"mpi4py in place {label}"] = timed(
            lambda: comm.Allreduce(MPI.IN_PLACE, host), repeats, comm.Barrier)
        results[f"mpi4py src->dst {label}"] = timed(
            lambda: comm.Allreduce(host, out), repeats, comm.Barrier)
    rates = {}
    for turn in range(2):  # interleaved: the machine is noisy
        rates.setdefault("ceiling", []).append(gluon_step_rate(
            lambda p: mx.gluon.Trainer(p, "sgd", {"learning_rate": 0.01}, kvstore=None),
            steps, comm.Barrier, comm.Get_size()))
        rates.setdefault("tfring", []).append(gluon_step_rate(
            lambda p: hvd.DistributedTrainer(p, "sgd", {"learning_rate": 0.01},
                                             prefix=f"bench{turn}."),
            steps, comm.Barrier, comm.Get_size()))
    if comm.Get_rank() == 0:
        print("RESULT " + json.dumps({"times": worst_rank(comm, results), "rates": rates}))
    else:
        worst_rank(comm, results)


def worst_rank(comm, results):
    every = comm.allgather(results)
    return {k: np.max([r[k] for r in every], axis=0).tolist() for k in results}


def run_kvstore(repeats, steps):
    import mxnet as mx
    kv = mx.kv.create("dist_sync")
    barrier = kv._barrier
    results = {}
    for size in SIZES:
        key = 1000 + size.bit_length()  # the Trainer below uses keys 0, 1, ...
        array = mx.nd.ones((size // 4,))
        kv.init(key, array)

        def push_pull():
            kv.push(key, array)
            kv.pull(key, out=array)
            array.wait_to_read()
        results[f"kvstore push+pull {size}"] = timed(push_pull, repeats, barrier)
    # No Gluon step on the kvstore: a gluon.Trainer on kvstore('dist_sync')
    # aborted in ps-lite on this machine (a server's check on an empty
    # message), with and without update_on_kvstore.
    rates = {}
    if kv.rank == 0:
        print("RESULT " + json.dumps({"times": results, "rates": rates}), flush=True)


def run_tf(repeats):
    import tensorflow as tf
    from mpi4py import MPI
    import tfring as hvd
    hvd.init()
    comm = MPI.COMM_WORLD
    results = {}
    for size in SIZES:
        tensor = tf.ones((size // 4,))
        results[f"tfring TensorFlow {size}"] = timed(
            lambda: hvd.allreduce(tensor, op=hvd.Sum, name=f"tf{size}").numpy(), repeats,
            comm.Barrier)
    merged = worst_rank(comm, results)
    if comm.Get_rank() == 0:
        print("RESULT " + json.dumps({"times": merged, "rates": {}}), flush=True)


if __name__ == "__main__":
    which, repeats, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    {"tfring": lambda: run_tfring(repeats, steps), "kvstore": lambda: run_kvstore(repeats, steps),
     "tf": lambda: run_tf(repeats)}[which]()
