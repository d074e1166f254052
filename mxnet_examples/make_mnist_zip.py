"""Writes data-<rank>/mnist.zip for N ranks: generated MNIST-format images
(idx files, 28x28, ten classes each drawn as a bright block at its own
place), so that Horovod's examples/mxnet/mxnet_mnist.py runs offline with
only its imports changed (`import tfring as horovod`, `import tfring.mxnet
as hvd`): its download() finds the file and skips the network.

    .venv-mxnet/bin/python mxnet_examples/make_mnist_zip.py --ranks 2
    tfringrun -np 2 .venv-mxnet/bin/python mxnet_mnist.py --epochs 1 --no-cuda
"""

import argparse
import io
import os
import struct
import zipfile

import numpy as np


def images_and_labels(count, seed):
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 10, size=count).astype(np.uint8)
    images = (rng.rand(count, 28, 28) * 40).astype(np.uint8)
    for i, label in enumerate(labels):
        row, col = 2 + (label // 5) * 13, 2 + (label % 5) * 5
        images[i, row:row + 10, col:col + 4] = 255
    return images, labels


def idx(array):
    """The idx file format of MNIST: magic (dtype code 8 = ubyte, rank),
    big-endian dimensions, then the bytes."""
    header = struct.pack(">HBB", 0, 8, array.ndim) + struct.pack(
        ">" + "I" * array.ndim, *array.shape)
    return header + array.tobytes()


def mnist_zip(train, test):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for prefix, (images, labels) in (("train", train), ("t10k", test)):
            archive.writestr(f"{prefix}-images-idx3-ubyte", idx(images))
            archive.writestr(f"{prefix}-labels-idx1-ubyte", idx(labels))
    return buffer.getvalue()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--train", type=int, default=2048)
    parser.add_argument("--test", type=int, default=512)
    args = parser.parse_args()
    data = mnist_zip(images_and_labels(args.train, 0), images_and_labels(args.test, 1))
    for rank in range(args.ranks):
        os.makedirs(f"data-{rank}", exist_ok=True)
        with open(os.path.join(f"data-{rank}", "mnist.zip"), "wb") as f:
            f.write(data)
    print(f"wrote data-0..data-{args.ranks - 1}/mnist.zip")


if __name__ == "__main__":
    main()
