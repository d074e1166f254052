# A sampler that shards a dataset over however many ranks the job has now.
#
# Why: after a reset the number of ranks changed; the samples of the epoch
# not processed yet are dealt out again over the new ranks, so none is
# skipped or seen twice. Keep it in the TorchState (`sampler=sampler`) and
# call record_batch() after each batch, as with Horovod's ElasticSampler.

import math
import random

import torch.utils.data

from tfring import basics


class ElasticSampler(torch.utils.data.Sampler):
    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.reset()

    def set_epoch(self, epoch):
        """Starts `epoch`: every sample is to be processed again."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Marks this rank's batch `batch_idx` of `batch_size` as processed
        (every rank's, as ranks process their batches in step)."""
        start = batch_idx * batch_size
        for offset in range(start, min(start + batch_size, self.num_samples)):
            for rank in range(self.num_replicas):
                position = offset * self.num_replicas + rank
                if position < len(self._dealt):
                    self.processed_indices.add(self._dealt[position])

    def record_indices(self, indices):
        self.processed_indices.update(indices)

    def state_dict(self):
        return {"epoch": self.epoch,
                "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state):
        self.epoch = state["epoch"]
        self.processed_indices = set(state["processed_indices"])
        self.reset()

    def reset(self):
        """Deals the samples not yet processed over the ranks there are now."""
        self.num_replicas = basics.size() if basics.is_initialized() else 1
        self.rank = basics.rank() if basics.is_initialized() else 0
        indices = [i for i in range(len(self.dataset))
                   if i not in self.processed_indices]
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices
        self.num_samples = int(math.ceil(len(indices) / self.num_replicas))
        padded = indices + indices[:self.num_samples * self.num_replicas
                                   - len(indices)]
        self._dealt = padded
        self.indices = padded[self.rank::self.num_replicas]

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
