# A PyTorch script in the style of Horovod's pytorch_mnist example (torch
# 1.x idioms: torch.cuda.amp, size_average=, launched through horovod.run
# when --num-proc is given) and of its ImageNet example (metrics averaged
# by name, a checkpoint to resume from), on generated data of MNIST's
# shapes. Ported by python -m tfring.migrate in tests/test_migrate.py, then
# run at 2 ranks.
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import horovod
import horovod.torch as hvd

parser = argparse.ArgumentParser(description='PyTorch MNIST-style Example')
parser.add_argument('--batch-size', type=int, default=16, metavar='N')
parser.add_argument('--test-batch-size', type=int, default=32, metavar='N')
parser.add_argument('--epochs', type=int, default=2, metavar='N')
parser.add_argument('--lr', type=float, default=0.01, metavar='LR')
parser.add_argument('--momentum', type=float, default=0.5, metavar='M')
parser.add_argument('--no-cuda', action='store_true', default=False)
parser.add_argument('--seed', type=int, default=42, metavar='S')
parser.add_argument('--log-interval', type=int, default=4, metavar='N')
parser.add_argument('--fp16-allreduce', action='store_true', default=False)
parser.add_argument('--checkpoint', default='./checkpoint.pth.tar')
# Arguments when not run through horovodrun
parser.add_argument('--num-proc', type=int)


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def generated_mnist(count, seed):
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(count, 1, 28, 28, generator=generator)
    labels = torch.randint(10, (count,), generator=generator)
    return torch.utils.data.TensorDataset((images - 0.1307) / 0.3081, labels)


class Metric(object):
    def __init__(self, name):
        self.name = name
        self.sum = torch.tensor(0.)
        self.n = torch.tensor(0.)

    def update(self, val):
        self.sum += hvd.allreduce(val.detach().cpu(), name=self.name)
        self.n += 1

    @property
    def avg(self):
        return self.sum / self.n


def main(args):
    def train_epoch(epoch):
        model.train()
        # Horovod: set epoch to sampler for shuffling.
        train_sampler.set_epoch(epoch)
        train_loss = Metric('train_loss')
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            with torch.cpu.amp.autocast(enabled=False):
                output = model(data)
                loss = F.nll_loss(output, target)
            scaler.scale(loss).backward()
            # Make sure all async allreduces are done
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
            scaler.update()
            train_loss.update(loss)
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                print('Train Epoch: {} [{}/{}]\tLoss: {:.6f}'.format(
                    epoch, batch_idx * len(data), len(train_sampler), loss.item()))
        return train_loss.avg.item()

    def metric_average(val, name):
        tensor = torch.tensor(val)
        avg_tensor = hvd.allreduce(tensor, name=name)
        return avg_tensor.item()

    def test():
        model.eval()
        test_loss = 0.
        test_accuracy = 0.
        for data, target in test_loader:
            output = model(data)
            # sum up batch loss
            test_loss += F.nll_loss(output, target, size_average=False).item()
            pred = output.data.max(1, keepdim=True)[1]
            test_accuracy += pred.eq(target.data.view_as(pred)).cpu().float().sum()
        test_loss /= len(test_sampler)
        test_accuracy /= len(test_sampler)
        return (metric_average(test_loss, 'avg_loss'),
                metric_average(test_accuracy, 'avg_accuracy'))

    # Horovod: initialize library.
    hvd.init()
    torch.manual_seed(args.seed)

    if args.cuda:
        # Horovod: pin GPU to local rank.
        torch.cuda.set_device(hvd.local_rank())

    # Horovod: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)

    train_dataset = generated_mnist(100, seed=1)
    # Horovod: use DistributedSampler to partition the training data.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, sampler=train_sampler)
    test_dataset = generated_mnist(64, seed=2)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    test_loader = torch.utils.data.DataLoader(
        test_dataset, batch_size=args.test_batch_size, sampler=test_sampler)

    model = Net()
    # Horovod: scale learning rate by the number of workers.
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                          momentum=args.momentum)

    # Horovod: resume on rank 0, which broadcasts to the others.
    resume = hvd.broadcast(torch.tensor(int(os.path.exists(args.checkpoint))),
                           root_rank=0, name='resume').item()
    if resume and hvd.rank() == 0:
        checkpoint = torch.load(args.checkpoint)
        model.load_state_dict(checkpoint['model'])
        optimizer.load_state_dict(checkpoint['optimizer'])

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Average)
    scaler = torch.cuda.amp.GradScaler(enabled=args.cuda)

    for epoch in range(1, args.epochs + 1):
        train_loss = train_epoch(epoch)
        test_loss, test_accuracy = test()
        if hvd.rank() == 0:
            print('Test set: Average loss: {:.4f}, Accuracy: {:.2f}%'.format(
                test_loss, 100. * test_accuracy))
            torch.save({'model': model.state_dict(),
                        'optimizer': optimizer.state_dict()}, args.checkpoint)

    weights = hvd.allgather(torch.cat([p.detach().reshape(1, -1) for p in model.parameters()], 1))
    assert torch.equal(weights[0], weights[-1]), "ranks ended with different weights"
    print(f"rank {hvd.rank()} PORTED_SCRIPT_DONE resumed={resume} "
          f"train_loss={train_loss:.4f} test_loss={test_loss:.4f}", flush=True)


if __name__ == '__main__':
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    if args.num_proc:
        # run training through horovod.run
        horovod.run(main, args=(args,), np=args.num_proc)
    else:
        # this is running via horovodrun
        main(args)
