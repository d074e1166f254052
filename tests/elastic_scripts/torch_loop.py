"""A PyTorch loop with tfring.torch.elastic's TorchState and
ElasticSampler, for tests/test_elastic_frontends.py. Original rank
KILL_RANK dies with SIGKILL before batch 1 of epoch 1.
Usage: torch_loop.py KILL_RANK"""
import json
import os
import signal
import sys

import torch

import tfring.torch as hvd

EPOCHS, BATCH = 3, 2
kill_rank = int(sys.argv[1])
hvd.init()
original_rank = hvd.rank()
torch.manual_seed(original_rank)  # different weights: sync() aligns them
model = torch.nn.Linear(3, 1)
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.05),
    named_parameters=model.named_parameters())
data = torch.utils.data.TensorDataset(torch.arange(36.0).reshape(12, 3) / 36,
                                      torch.arange(12.0).reshape(12, 1) / 12)
sampler = hvd.elastic.ElasticSampler(data, shuffle=False)
loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler)
state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)
seen = []


@hvd.elastic.run
def train(state):
    while state.epoch < EPOCHS:
        for batch_idx, (x, y) in enumerate(loader):
            if original_rank == kill_rank and state.epoch == 1 and batch_idx == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            sampler.record_batch(batch_idx, BATCH)
            state.commit()
        state.epoch += 1
        sampler.set_epoch(state.epoch)
        state.commit()


train(state)
print("RESULT " + json.dumps({
    "original_rank": original_rank, "size": hvd.size(), "epoch": state.epoch,
    "weights": [p.detach().tolist() for p in model.parameters()]}),
    flush=True)
