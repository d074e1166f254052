"""Trains a small Gluon classifier on N ranks with tfring.mxnet.

The data is generated (ten Gaussian clusters in 20 dimensions, the same on
every rank from a fixed seed), so it runs offline. Each rank trains on every
size()-th sample. It is a plain single-process Gluon loop made distributed
with tfring.mxnet (horovod.mxnet's API); every line that tfring adds or
changes ends with `# tfring:`.

    tfringrun -np 2 .venv-mxnet/bin/python mxnet_examples/gluon_blobs.py
    .venv-mxnet/bin/python mxnet_examples/gluon_blobs.py    # one process works too

What tfring does here:
  * DistributedTrainer averages every gradient over the ranks at each
    trainer.step(), so 2 ranks with --batch-size 32 train like one process
    with batch 64;
  * the learning rate is scaled by the number of ranks;
  * every rank starts from rank 0's weights (broadcast_parameters);
  * the validation accuracy is averaged over the ranks (allreduce), and only
    rank 0 prints.
"""

import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import tfring.mxnet as hvd  # tfring: the same API as horovod.mxnet

CLASSES = 10
FEATURES = 20


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="for one rank")
    parser.add_argument("--samples", type=int, default=4000)
    return parser.parse_args()


def make_data(samples):
    rng = np.random.RandomState(0)
    centers = rng.randn(CLASSES, FEATURES).astype(np.float32) * 2
    labels = rng.randint(0, CLASSES, size=samples)
    points = centers[labels] + rng.randn(samples, FEATURES).astype(np.float32)
    return points, labels.astype(np.float32)


def main():
    args = parse_args()
    hvd.init()  # tfring: start the job's core

    points, labels = make_data(args.samples)
    split = args.samples * 4 // 5
    mine = slice(hvd.rank(), split, hvd.size())  # tfring: this rank's share
    train = gluon.data.ArrayDataset(points[mine], labels[mine])
    batches = gluon.data.DataLoader(train, batch_size=args.batch_size, shuffle=True)
    validation = (mx.nd.array(points[split:]), labels[split:])

    mx.random.seed(hvd.rank())  # different on each rank until broadcast
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(CLASSES))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, FEATURES)))  # runs the deferred initialization
    net.hybridize()
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)  # tfring: rank 0's weights everywhere
    trainer = hvd.DistributedTrainer(  # tfring: averages the gradients
        params, "sgd", {"learning_rate": args.lr * hvd.size(),  # tfring: scaled lr
                        "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    for epoch in range(args.epochs):
        for data, label in batches:
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(data.shape[0])
        predicted = net(validation[0]).argmax(axis=1).asnumpy()
        accuracy = mx.nd.array([np.mean(predicted == validation[1])])
        accuracy = hvd.allreduce(accuracy, name="accuracy").asscalar()  # tfring: average
        if hvd.rank() == 0:  # tfring: one rank prints
            print(f"Epoch {epoch}: validation accuracy {accuracy:.3f}", flush=True)
    if hvd.rank() == 0:  # tfring: one rank prints
        print(f"Final validation accuracy: {accuracy:.3f}")
        print(f"Trained {args.epochs} epochs on {hvd.size()} ranks")


if __name__ == "__main__":
    main()
