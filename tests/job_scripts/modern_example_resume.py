"""Resumes torch_examples/train_modern.py from its checkpoint on every rank,
then trains on; run by tests/test_examples.py after a first run of the
example has written CHECKPOINT.

First, the example's own resume() on a model, optimizer and schedule that
each rank builds differently (its own seed, and no optimizer state): every
rank must end with exactly the checkpoint's weights, optimizer state and
schedule position. Then the example's main() continues to EPOCHS, and every
rank must hold the same weights at the end.

Usage: modern_example_resume.py CHECKPOINT EPOCHS
"""
import pathlib
import runpy
import sys

import torch

import tfring.torch as hvd

EXAMPLE = (pathlib.Path(__file__).resolve().parents[2] / "torch_examples"
           / "train_modern.py")


def fail(message):
    print(f"rank {hvd.rank()} FAILED: {message}", flush=True)
    sys.exit(1)


def check_resumed(example, checkpoint):
    saved = torch.load(checkpoint)
    torch.manual_seed(100 + hvd.rank())  # a different start on every rank
    model = example["Classifier"]()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.AdamW(model.parameters(), lr=0.001),
        named_parameters=model.named_parameters())
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=0.01, total_steps=1000)
    epochs_done = example["resume"](checkpoint, model, optimizer, scheduler)
    if epochs_done != saved["epochs_done"]:
        fail(f"resume() returned {epochs_done} epochs, the checkpoint has "
             f"{saved['epochs_done']}")
    for name, tensor in model.state_dict().items():
        if not torch.equal(tensor, saved["model"][name]):
            fail(f"parameter {name} differs from the checkpoint's")
    state = optimizer.state_dict()
    for index, expected in saved["optimizer"]["state"].items():
        for key, value in expected.items():
            if not torch.equal(torch.as_tensor(state["state"][index][key]),
                               torch.as_tensor(value)):
                fail(f"optimizer state {index}.{key} differs from the "
                     f"checkpoint's")
    for key in ("last_epoch", "total_steps"):
        if scheduler.state_dict()[key] != saved["scheduler"][key]:
            fail(f"schedule {key} {scheduler.state_dict()[key]} != the "
                 f"checkpoint's {saved['scheduler'][key]}")
    print(f"rank {hvd.rank()} RESUMED_OK at epoch {epochs_done}", flush=True)


def check_same_weights_everywhere(model):
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    everyone = hvd.allgather(flat.unsqueeze(0), name="final_weights")
    for rank in range(hvd.size()):
        if not torch.equal(everyone[rank], flat):
            fail(f"rank {rank}'s final weights differ from this rank's")
    print(f"rank {hvd.rank()} SAME_WEIGHTS_OK", flush=True)


def main():
    checkpoint, epochs = sys.argv[1], sys.argv[2]
    example = runpy.run_path(str(EXAMPLE))  # not as __main__: no training
    hvd.init()
    check_resumed(example, checkpoint)
    model = example["main"](["--epochs", epochs, "--checkpoint", checkpoint])
    check_same_weights_everywhere(model)


if __name__ == "__main__":
    main()
