"""Trains a small CNN on scikit-learn's digits with PyTorch, on N ranks.

The data is the 8x8 digit images that ship inside scikit-learn
(`sklearn.datasets.load_digits`: 1797 images, 10 classes), so it runs
offline. A fixed fifth of the images is held out for validation; each rank
trains on every size()-th of the rest (at 3 ranks rank 0 holds 480 images
and the others 479, so rank 0 runs one step more per epoch). It is a plain
single-process PyTorch loop made distributed with tfring.torch
(horovod.torch's API); every line that tfring adds or changes ends with
`# tfring:`.

    tfringrun -np 2 python torch_examples/digits.py
    python torch_examples/digits.py          # one process works too

What tfring does here:
  * each gradient is averaged over the ranks as soon as backward has
    produced it, while backward goes on (DistributedOptimizer), so 2 ranks
    with --batch-size 32 train like one process with batch 64;
  * the learning rate is scaled by the number of ranks;
  * every rank starts from rank 0's weights and optimizer state;
  * a rank that runs out of batches calls hvd.join(): until every rank has,
    it takes part in the others' allreduces without a gradient of its own
    (the average is over the ranks that still have data), and afterwards
    every rank takes the weights and optimizer state of the last rank to
    join, which ran every step;
  * the validation accuracy is averaged over the ranks (allreduce), and only
    rank 0 prints.
"""

import argparse

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import tfring.torch as hvd  # tfring: the same API as horovod.torch


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=0,
                        help="steps per epoch (0: one pass over this rank's "
                        "share, which may differ between ranks)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="per rank")
    parser.add_argument("--lr", type=float, default=0.02,
                        help="for one rank; scaled by the number of ranks")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = torch.nn.Linear(32 * 2 * 2, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load_data(seed):
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    y = torch.tensor(labels, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    held_out = len(x) // 5
    validation = order[:held_out]
    train = order[held_out:]
    return (x[train], y[train]), (x[validation], y[validation])


def main():
    args = parse_args()
    hvd.init()  # tfring:
    torch.manual_seed(args.seed)
    (x_train, y_train), (x_val, y_val) = load_data(args.seed)
    # tfring: this rank's share of the training and validation images.
    x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]
    x_val, y_val = x_val[hvd.rank()::hvd.size()], y_val[hvd.rank()::hvd.size()]  # tfring:

    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(),
                                lr=args.lr * hvd.size(),  # tfring:
                                momentum=0.9)
    optimizer = hvd.DistributedOptimizer(  # tfring:
        optimizer, named_parameters=model.named_parameters())  # tfring:
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # tfring:
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)  # tfring:

    steps = args.steps or len(x_train) // args.batch_size
    generator = torch.Generator().manual_seed(args.seed + hvd.rank())  # tfring:
    for epoch in range(args.epochs):
        model.train()
        for _ in range(steps):
            batch = torch.randint(len(x_train), (args.batch_size,),
                                  generator=generator)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
        # tfring: out of batches; wait for the ranks that still have some.
        last = hvd.join()  # tfring:
        hvd.broadcast_parameters(model.state_dict(), root_rank=last)  # tfring:
        hvd.broadcast_optimizer_state(optimizer, root_rank=last)  # tfring:
        model.eval()
        with torch.no_grad():
            correct = (model(x_val).argmax(1) == y_val).double().sum()
        totals = hvd.allreduce(torch.stack([correct, torch.tensor(  # tfring:
            float(len(y_val)), dtype=torch.float64)]), op=hvd.Sum)  # tfring:
        accuracy = float(totals[0] / totals[1])
        if hvd.rank() == 0:  # tfring:
            print(f"epoch {epoch + 1}: loss {loss.item():.4f} "
                  f"validation accuracy {accuracy:.4f}", flush=True)
    all_steps = hvd.allgather_object(steps)  # tfring:
    if hvd.rank() == 0:  # tfring:
        print(f"Final validation accuracy: {accuracy:.4f}")
        print(f"Trained {args.epochs} epochs x {max(all_steps)} steps on "
              f"{hvd.size()} ranks (steps per epoch, rank by rank: "
              f"{', '.join(map(str, all_steps))})")


if __name__ == "__main__":
    main()
