"""The timed work of benchmarks/mxnet_allreduce.py, one process per rank.

    _mxnet_workers.py tfring   under mpirun, MXNet's environment: tfring.mxnet
                               allreduce (in place and new output) and mpi4py
                               Allreduce; a Gluon step with DistributedTrainer,
                               its engine-push variant, a barrier alone and
                               without communication (the ceiling)
    _mxnet_workers.py kvstore  as a DMLC worker of kvstore('dist_sync'): push
                               and pull of the same sizes; the Gluon step on
                               the kvstore and its ceiling
    _mxnet_workers.py tf       under mpirun, the main environment: tfring's
                               TensorFlow allreduce of the same sizes

Each prints one line "RESULT <json>" on its first rank: {case: seconds[]}
for the collectives (medians taken by the caller), {"variant batch":
img/s[]} for the training step.
"""

import json
import sys
import time

import numpy as np

SIZES = [4 * 1024, 256 * 1024, 4 * 1024 * 1024, 64 * 1024 * 1024]
BATCH = 32
TRAIN_BATCHES = (32, 128)


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


class GluonStep:
    """A small CNN's training step with the trainer `trainer_factory`
    makes for its parameters; rate() times it at a batch size."""

    def __init__(self, trainer_factory):
        import mxnet as mx
        from mxnet import gluon
        mx.random.seed(0)
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Conv2D(32, 3, activation="relu"), gluon.nn.MaxPool2D(),
                gluon.nn.Conv2D(64, 3, activation="relu"), gluon.nn.MaxPool2D(),
                gluon.nn.Flatten(), gluon.nn.Dense(128, activation="relu"), gluon.nn.Dense(10))
        net.initialize(mx.init.Xavier())
        net.hybridize()
        self.net = net
        net(mx.nd.zeros((1, 1, 28, 28)))
        self.trainer = trainer_factory(net.collect_params())
        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def _step(self, data, label):
        import mxnet as mx
        from mxnet import autograd
        with autograd.record():
            loss = self.loss_fn(self.net(data), label)
        loss.backward()
        self.trainer.step(data.shape[0])
        mx.nd.waitall()

    def rate(self, batch, barrier, ranks, images=BATCH * 200):
        """Images per second over all ranks, for about `images` per rank."""
        import mxnet as mx
        data = mx.nd.random.uniform(shape=(batch, 1, 28, 28))
        label = mx.nd.array(np.random.RandomState(0).randint(0, 10, batch))
        steps = max(10, images // batch)
        for _ in range(3):
            self._step(data, label)
        barrier()
        start = time.perf_counter()
        for _ in range(steps):
            self._step(data, label)
        barrier()
        return ranks * batch * steps / (time.perf_counter() - start)


def interleaved_rates(models, steps, barrier, ranks, turns=3):
    """{"<name> <batch>": [img/s per turn]} of each GluonStep of `models`
    at each batch size of TRAIN_BATCHES, the models taking turns (the
    machine is noisy); `steps` steps of BATCH images per measurement."""
    rates = {}
    for batch in TRAIN_BATCHES:
        for _ in range(turns):
            for name, model in models.items():
                rates.setdefault(f"{name} {batch}", []).append(
                    model.rate(batch, barrier, ranks, images=steps * BATCH))
    return rates


def barrier_trainer_class(comm):
    """A gluon.Trainer that only waits for its gradients and meets the other
    ranks at an MPI barrier each step: what synchronising alone costs, the
    floor of any synchronous data-parallel step."""
    import mxnet as mx

    class BarrierTrainer(mx.gluon.Trainer):
        def _allreduce_grads(self):
            mx.nd.waitall()
            comm.Barrier()

    return BarrierTrainer


def engine_push_trainer_class():
    """DistributedTrainer whose gradient allreduce is pushed into MXNet's
    engine (MXEnginePushSyncND, the gradients as mutable dependencies)
    instead of waited for by the Python thread: the measured alternative to
    tfring.mxnet's way (docs/mxnet.md). Python returns at once and queues the
    optimizer's updates behind the pushed operation; one engine thread runs
    the operation, which hands the group to the core and waits for it."""
    import ctypes

    import mxnet as mx
    import tfring.mxnet as hvd
    from tfring.common import outcome
    from tfring.mxnet import collectives, ndarrays

    sync_func = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)

    class CpuContext(ctypes.Structure):
        _fields_ = [("dev_type", ctypes.c_int), ("dev_id", ctypes.c_int)]

    cpu = CpuContext(1, 0)
    push = mx.base._LIB.MXEnginePushSyncND

    class EnginePushTrainer(hvd.DistributedTrainer):
        def _allreduce_grads(self):
            grads = [p.list_grad()[0] for p in self._params if p.grad_req != "null"]
            dtypes = [ndarrays.check_array(g, "bench", reduction=True) for g in grads]
            addresses = [ndarrays.address(g) for g in grads]
            fields = collectives.allreduce_fields(hvd.Average, None, 1.0, 1.0,
                                                  hvd.global_process_set, "bench")
            names = [f"engine.{self._prefix}{i}" for i in range(len(grads))]
            key = collectives.names.next_group_key()

            def body(_run_context, _param):
                # On an engine thread, after MXNet's writes of the gradients
                # and before any later reader: no waiting on the arrays here.
                pending = [outcome.enqueue(
                    collectives._CollectiveType.allreduce, name, dtype, g.shape, address,
                    output=address, group_key=key, group_size=len(grads), **fields)
                    for name, dtype, g, address in zip(names, dtypes, grads, addresses)]
                outcome.wait_all(pending)

            self._pushed = sync_func(body)  # alive until the next step
            handles = (ctypes.c_void_p * len(grads))(*[g.handle.value for g in grads])
            mx.base.check_call(push(self._pushed, None, None, ctypes.byref(cpu), None, 0,
                                    handles, len(grads), None, 0, b"tfring_allreduce"))

    return EnginePushTrainer


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
    engine_push = engine_push_trainer_class()
    sgd = {"learning_rate": 0.01}
    models = {
        "ceiling": GluonStep(lambda p: mx.gluon.Trainer(p, "sgd", sgd, kvstore=None)),
        "barrier only": GluonStep(lambda p: barrier_trainer_class(comm)(p, "sgd", sgd,
                                                                        kvstore=None)),
        "tfring": GluonStep(lambda p: hvd.DistributedTrainer(p, "sgd", sgd, prefix="bench.")),
        "tfring engine push": GluonStep(lambda p: engine_push(p, "sgd", sgd, prefix="push.")),
    }
    rates = interleaved_rates(models, steps, comm.Barrier, comm.Get_size())
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
    models = {
        "ceiling": GluonStep(lambda p: mx.gluon.Trainer(p, "sgd", {"learning_rate": 0.01},
                                                        kvstore=None)),
        # One kvstore Trainer for every measurement: a second one would
        # initialise the same keys again, which the server takes for a push
        # and waits for.
        "kvstore": GluonStep(lambda p: kvstore_trainer(p, kv)),
    }
    rates = interleaved_rates(models, steps, barrier, kv.num_workers)
    if kv.rank == 0:
        print("RESULT " + json.dumps({"times": results, "rates": rates}), flush=True)


def kvstore_trainer(params, kv):
    """A gluon.Trainer on `kv`, its keys initialised before the first step.

    The servers sum the gradients and the workers update their weights
    (update_on_kvstore=False): the faster of the two ways here (the
    optimizer on the server ran at 0.83 of its speed in a trial), and the
    one that does the same work as an allreduce.

    Rank 0 alone initialises a key on the server; with both workers on one
    machine the other's first push can reach the server first, which then
    aborts ("init N first", a known ps-lite race), so the workers meet at a
    barrier after the initialisation."""
    import mxnet as mx
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.01}, kvstore=kv,
                               update_on_kvstore=False)
    trainer._init_kvstore()
    mx.nd.waitall()
    kv._barrier()
    return trainer


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
