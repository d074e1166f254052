"""Trains a classifier on N ranks the way a PyTorch script of today does.

Everything a Horovod PyTorch user reaches for in one program, on generated
data (Gaussian inputs in 10 classes, labelled by a fixed random linear
map), so it runs offline:

  * sharding: a DataLoader over a DistributedSampler(num_replicas=size,
    rank=rank), reshuffled every epoch with set_epoch(epoch);
  * bf16 autocast on the CPU (torch.autocast("cpu", dtype=torch.bfloat16));
  * gradient clipping on the averaged gradients: optimizer.synchronize(),
    clip, then `with optimizer.skip_synchronize(): optimizer.step()`;
  * AdamW with a OneCycleLR schedule whose peak learning rate is scaled by
    the number of ranks;
  * a checkpoint written by rank 0 after every epoch, and resuming from it:
    rank 0 loads it, then broadcast_parameters, broadcast_optimizer_state
    and broadcast_object (epoch and schedule) give every rank its state;
  * uneven data: each epoch sees every sample exactly once (DistributedSampler
    would repeat samples to pad the ranks to one length; this script trims
    that padding), so ranks can hold different numbers of batches. The
    default 3,841 samples leave one over at 2 to 6 ranks: rank 0 runs one
    step more than the others every epoch. A rank that runs out calls
    hvd.join(); afterwards every rank takes the state of the last rank to
    join, which ran every step;
  * metrics summed over the ranks with hvd.allreduce; only rank 0 prints.

    tfringrun -np 2 python torch_examples/train_modern.py --checkpoint ckpt.pt
    # interrupted? the same command continues after the last saved epoch

Every line that tfring adds to a single-process script ends with `# tfring:`.
"""

import argparse
import itertools
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import tfring.torch as hvd  # tfring: the same API as horovod.torch

NUM_FEATURES = 32
NUM_CLASSES = 10


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=8,
                        help="epochs in all (the learning-rate schedule's "
                        "length)")
    parser.add_argument("--stop-after", type=int, default=0,
                        help="stop after this many epochs of this run (e.g. "
                        "a job's time limit; 0: train to --epochs); run the "
                        "same command again to continue from --checkpoint")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.004,
                        help="OneCycleLR's peak for one rank; scaled by the "
                        "number of ranks")
    parser.add_argument("--clip-norm", type=float, default=1.0,
                        help="clip the averaged gradients' norm to this")
    parser.add_argument("--samples", type=int, default=3841,
                        help="training samples in all ranks together")
    parser.add_argument("--validation-samples", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=0,
                        help="DataLoader worker processes per rank")
    parser.add_argument("--checkpoint", default=None,
                        help="file that rank 0 writes after every epoch and "
                        "that a new run resumes from")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.stop_after and not args.checkpoint:
        parser.error("--stop-after needs --checkpoint: without one, nothing "
                     "is saved for the next run to continue from")
    return args


def generated_data(samples, seed):
    """Gaussian inputs, each labelled with the class that a fixed random
    linear map (the "teacher", the same for every seed) scores highest."""
    teacher = torch.randn(NUM_FEATURES, NUM_CLASSES,
                          generator=torch.Generator().manual_seed(1234))
    x = torch.randn(samples, NUM_FEATURES,
                    generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, (x @ teacher).argmax(1))


class UnpaddedDistributedSampler(DistributedSampler):
    """DistributedSampler without the samples it repeats to give every rank
    the same count: this rank's share of a shuffled epoch, each sample of the
    data set on exactly one rank. DistributedSampler pads the end of the
    shuffled order and deals it out rank by rank, so each rank's repeated
    samples are the last of its share; they are cut off here."""

    def __init__(self, dataset, **kwargs):
        super().__init__(dataset, drop_last=False, **kwargs)
        self.unpadded_samples = len(
            range(self.rank, len(self.dataset), self.num_replicas))

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.unpadded_samples)

    def __len__(self):
        return self.unpadded_samples


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(NUM_FEATURES, 128), torch.nn.GELU(),
            torch.nn.LayerNorm(128),
            torch.nn.Linear(128, 128), torch.nn.GELU(),
            torch.nn.Linear(128, NUM_CLASSES))

    def forward(self, x):
        return self.layers(x)


def loader(dataset, batch_size, workers, shuffle, seed):
    sampler = UnpaddedDistributedSampler(  # tfring: this rank's share
        dataset, num_replicas=hvd.size(), rank=hvd.rank(),  # tfring:
        shuffle=shuffle, seed=seed)  # tfring:
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                      num_workers=workers, persistent_workers=workers > 0)


def take_state_of(rank, model, optimizer, scheduler):
    """Makes every rank's model, optimizer and schedule those of `rank`."""
    hvd.broadcast_parameters(model.state_dict(), root_rank=rank)  # tfring:
    hvd.broadcast_optimizer_state(optimizer, root_rank=rank)  # tfring:
    scheduler.load_state_dict(hvd.broadcast_object(  # tfring:
        scheduler.state_dict(), root_rank=rank))  # tfring:


def save_checkpoint(path, model, optimizer, scheduler, epochs_done):
    state = {"model": model.state_dict(),
             "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(),
             "epochs_done": epochs_done}
    # Written aside and renamed, so a job killed mid-write keeps the last one.
    torch.save(state, path + ".partial")
    os.replace(path + ".partial", path)


def resume(path, model, optimizer, scheduler):
    """Rank 0 loads `path` if it exists; every rank then has its state.
    Returns the number of epochs already done."""
    epochs_done = 0
    if hvd.rank() == 0 and path and os.path.exists(path):  # tfring:
        state = torch.load(path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        epochs_done = state["epochs_done"]
    take_state_of(0, model, optimizer, scheduler)  # tfring:
    return hvd.broadcast_object(epochs_done, root_rank=0)  # tfring:


def train_epoch(model, optimizer, scheduler, batches, clip_norm):
    """One pass over this rank's batches; returns (loss sum, samples)."""
    model.train()
    loss_sum, samples = 0.0, 0
    for x, y in batches:
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()  # tfring: allreduces start as gradients appear
        optimizer.synchronize()  # tfring: p.grad holds the averages now
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        with optimizer.skip_synchronize():  # tfring: already synchronized
            optimizer.step()
        scheduler.step()
        loss_sum += loss.item() * len(y)
        samples += len(y)
    return loss_sum, samples


def evaluate(model, batches):
    """Returns (correct predictions, samples) on this rank's batches."""
    model.eval()
    correct, samples = 0, 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for x, y in batches:
            correct += int((model(x).argmax(1) == y).sum())
            samples += len(y)
    return correct, samples


def main(argv=None):
    args = parse_args(argv)
    hvd.init()  # tfring:
    torch.manual_seed(args.seed)
    train_data = generated_data(args.samples, seed=args.seed)
    validation_data = generated_data(args.validation_samples,
                                     seed=args.seed + 1000)
    train_batches = loader(train_data, args.batch_size, args.workers,
                           shuffle=True, seed=args.seed)
    validation_batches = loader(validation_data, 256, args.workers,
                                shuffle=False, seed=args.seed)

    model = Classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr,
                                  weight_decay=0.01)
    optimizer = hvd.DistributedOptimizer(  # tfring:
        optimizer, named_parameters=model.named_parameters())  # tfring:
    # tfring: the schedule runs as long as the rank with the most batches.
    steps_per_epoch = int(hvd.allreduce(  # tfring:
        torch.tensor(len(train_batches)), op=hvd.Max))  # tfring:
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr * hvd.size(),  # tfring:
        epochs=args.epochs, steps_per_epoch=steps_per_epoch)
    epochs_done = resume(args.checkpoint, model, optimizer, scheduler)
    if hvd.rank() == 0 and epochs_done:  # tfring:
        print(f"resumed from {args.checkpoint} after epoch {epochs_done}",
              flush=True)

    last_epoch = args.epochs
    if args.stop_after:
        last_epoch = min(args.epochs, epochs_done + args.stop_after)
    for epoch in range(epochs_done, last_epoch):
        train_batches.sampler.set_epoch(epoch)  # tfring: a new shuffle
        loss_sum, samples = train_epoch(model, optimizer, scheduler,
                                        train_batches, args.clip_norm)
        # tfring: out of batches; the others may have one more. The ranks
        # that joined early missed those steps: take the last joiner's state.
        last_to_join = hvd.join()  # tfring:
        take_state_of(last_to_join, model, optimizer, scheduler)  # tfring:
        steps = hvd.allgather_object(len(train_batches))  # tfring:

        correct, seen = evaluate(model, validation_batches)
        totals = hvd.allreduce(torch.tensor(  # tfring: sums over the ranks
            [loss_sum, samples, correct, seen], dtype=torch.float64),
            op=hvd.Sum, name="metrics")  # tfring:
        train_loss = float(totals[0] / totals[1])
        accuracy = float(totals[2] / totals[3])
        if hvd.rank() == 0:  # tfring: only rank 0 writes
            if args.checkpoint:
                save_checkpoint(args.checkpoint, model, optimizer, scheduler,
                                epoch + 1)
            print(f"epoch {epoch + 1}/{args.epochs}: train loss "
                  f"{train_loss:.4f}, validation accuracy {accuracy:.4f}, "
                  f"steps per rank {steps}", flush=True)
    if hvd.rank() == 0 and last_epoch > epochs_done:  # tfring:
        if last_epoch < args.epochs:
            print(f"Stopped after epoch {last_epoch} of {args.epochs}; the "
                  f"same command continues from {args.checkpoint}")
        else:
            print(f"Final validation accuracy: {accuracy:.4f}")
    return model


if __name__ == "__main__":
    main()
