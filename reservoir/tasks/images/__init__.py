"""Image tasks: images cut into patches, one patch per token (continuous, 10 classes, train/test).

``mnist``, ``fashion-mnist``: IDX files (plain or ``.gz``; plain wins), /255
    into [0, 1]; ``size=32`` zero-pads 28x28 by 2 pixels a side (the paper:
    64 x 16 at patch 4), ``size=28`` is native (the official code: 49 x 16).
``digits``: scikit-learn's 8x8 digits, /16, 2x2 patches (16 x 4), seeded stratified split.
``cifar10``: the python batches, /255 then ``(x - mean_c) / std_c`` per
    channel, 4x4x3 patches (64 x 48, the official code's width).
``cifar10-lra``: grayscale ``0.2989 R + 0.5870 G + 0.1140 B`` (TF/LRA
    weights, on 0..255, /255, not rounded to integers as LRA's uint8 is) then
    ``2 x - 1`` into [-1, 1] (the official code's ``Normalize(0.5, 0.5)``), one
    pixel per token (1024 x 1).

Patch order (:func:`patchify`): token ``t`` is the patch at patch-row
``t // (W/p)``, patch-column ``t % (W/p)`` (top-left first, then along the
row), values ``patch[y, x, c]`` flattened row-major, channel last. No
augmentation (the official code crops/flips/rotates CIFAR): features are
extracted once. ``download=True`` fetches missing files with urllib into
``data_dir`` (default ``~/.cache/reservoir/<task>``).

- :mod:`~reservoir.tasks.images.idx`: IDX files (MNIST, Fashion-MNIST).
- :mod:`~reservoir.tasks.images.cifar`: CIFAR-10 python batches.
- :mod:`~reservoir.tasks.images.tasks`: patches and the registered tasks.
"""

from reservoir.tasks.images.cifar import (
    CIFAR_FOLDER,
    CIFAR_TEST,
    CIFAR_TRAIN,
    CIFAR_URL,
    read_cifar10,
    read_cifar_batch,
)
from reservoir.tasks.images.idx import IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, MNIST_FILES, MNIST_URLS, read_idx, read_mnist
from reservoir.tasks.images.tasks import (
    CIFAR_MEAN,
    CIFAR_STD,
    FASHION_MNIST_DIR,
    GRAY_WEIGHTS,
    build_cifar10,
    build_cifar10_lra,
    build_digits,
    build_fashion_mnist,
    build_mnist,
    patchify,
)

__all__ = ["CIFAR_FOLDER", "CIFAR_MEAN", "CIFAR_STD", "CIFAR_TEST", "CIFAR_TRAIN", "CIFAR_URL", "FASHION_MNIST_DIR",
           "GRAY_WEIGHTS", "IDX_IMAGES_MAGIC", "IDX_LABELS_MAGIC", "MNIST_FILES", "MNIST_URLS", "build_cifar10",
           "build_cifar10_lra", "build_digits", "build_fashion_mnist", "build_mnist", "patchify", "read_cifar10",
           "read_cifar_batch", "read_idx", "read_mnist"]  # fmt: skip
