"""Normalisation and augmentation on image batches `[B, C, H, W]`, written with torch ops.

Batched and device-agnostic (they run where the batch is), seeded by a `torch.Generator` so an
augmented training run is reproducible:

    augment = Augment(mean=CIFAR10_MEAN, std=CIFAR10_STD, seed=0)
    for X, y in batches:
        loss = criterion(model(augment(X)), y)

Per-data-set channel statistics are those of the training split in [0, 1] pixel units
(population std over all training pixels). CIFAR-10's are the exact per-channel values of the
original release; the (0.2023, 0.1994, 0.2010) std quoted in many repositories is a different
(per-image) statistic, not used here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)
SVHN_MEAN = (0.4377, 0.4438, 0.4728)
SVHN_STD = (0.1980, 0.2010, 0.1970)
STL10_MEAN = (0.4467, 0.4398, 0.4066)
STL10_STD = (0.2603, 0.2566, 0.2713)
MNIST_MEAN = (0.1307,)
MNIST_STD = (0.3081,)
FASHION_MNIST_MEAN = (0.2860,)
FASHION_MNIST_STD = (0.3530,)
#: data set name (as in `peg.data.names()`) -> (mean, std) per channel.
STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": (CIFAR10_MEAN, CIFAR10_STD),
    "cifar100": (CIFAR100_MEAN, CIFAR100_STD),
    "svhn": (SVHN_MEAN, SVHN_STD),
    "stl10": (STL10_MEAN, STL10_STD),
    "mnist": (MNIST_MEAN, MNIST_STD),
    "mnist-5k": (MNIST_MEAN, MNIST_STD),
    "fashion-mnist": (FASHION_MNIST_MEAN, FASHION_MNIST_STD),
}

Stat = Sequence[float] | Tensor


def _check_images(X: Tensor, name: str = "X") -> None:
    if not isinstance(X, Tensor) or X.ndim != 4:
        shape = tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__
        raise ValueError(f"{name}: expected an image batch [B, C, H, W] tensor, got {shape}")


def _check_padding(padding: int) -> None:
    if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
        raise ValueError(f"padding: expected a non-negative integer, got {padding!r}")


def _check_probability(p: float, name: str) -> None:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{name}: expected a probability in [0, 1], got {p!r}")


def _channel_stat(value: Stat, X: Tensor, name: str) -> Tensor:
    t = torch.as_tensor(value, dtype=X.dtype if X.is_floating_point() else torch.float32)
    t = t.to(X.device).reshape(-1)
    channels = X.shape[-3]
    if t.numel() not in (1, channels):
        raise ValueError(
            f"{name}: expected 1 or {channels} values (one per channel), got {t.numel()}"
        )
    return t.reshape(-1, 1, 1)


def _stds(std: Stat, X: Tensor) -> Tensor:
    s = _channel_stat(std, X, "std")
    if not bool(torch.all(s > 0)):
        raise ValueError(f"std: expected positive values, got {s.reshape(-1).tolist()}")
    return s


def normalize(X: Tensor, mean: Stat, std: Stat) -> Tensor:
    """`(X - mean) / std` per channel; X `[..., C, H, W]`, mean and std `C` values (or 1)."""
    if not isinstance(X, Tensor) or X.ndim < 3:
        raise ValueError("X: expected images [..., C, H, W] as a tensor")
    return (X - _channel_stat(mean, X, "mean")) / _stds(std, X)


def denormalize(X: Tensor, mean: Stat, std: Stat) -> Tensor:
    """The inverse of `normalize`: `X * std + mean` per channel."""
    if not isinstance(X, Tensor) or X.ndim < 3:
        raise ValueError("X: expected images [..., C, H, W] as a tensor")
    return X * _stds(std, X) + _channel_stat(mean, X, "mean")


def _draw(
    shape: tuple[int, ...],
    high: int | None,
    generator: torch.Generator | None,
    device: torch.device,
) -> Tensor:
    """Random integers in [0, high) (or uniforms when high is None) on the generator's device,
    then moved to `device`: one generator drives batches on any device."""
    gen_device = generator.device if generator is not None else torch.device("cpu")
    if high is None:
        values = torch.rand(shape, generator=generator, device=gen_device)
    else:
        values = torch.randint(0, high, shape, generator=generator, device=gen_device)
    return values.to(device)


def random_crop(X: Tensor, padding: int = 4, generator: torch.Generator | None = None) -> Tensor:
    """Zero-pad by `padding` on each side, then cut an `H×W` window at a random offset per image.

    Args:
        X: `[B, C, H, W]`.
        padding: pixels added on each side; offsets are uniform in 0..2·padding per axis.
        generator: source of the offsets (default: the global generator).

    Returns:
        `[B, C, H, W]`: image b is `pad(X[b])[:, dy:dy+H, dx:dx+W]`.
    """
    _check_images(X)
    _check_padding(padding)
    if padding == 0:
        return X.clone()
    B, _, H, W = X.shape
    offsets = _draw((2, B), 2 * padding + 1, generator, X.device)
    padded = F.pad(X, (padding, padding, padding, padding))
    rows = offsets[0, :, None] + torch.arange(H, device=X.device)  # [B, H]
    cols = offsets[1, :, None] + torch.arange(W, device=X.device)  # [B, W]
    batch = torch.arange(B, device=X.device)[:, None, None]
    # advanced indexing on [B, H', W', C] gathers every window at once: [B, H, W, C]
    windows = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]
    return windows.permute(0, 3, 1, 2).contiguous()


def random_hflip(X: Tensor, p: float = 0.5, generator: torch.Generator | None = None) -> Tensor:
    """Mirror each image left-right with probability `p`; X `[B, C, H, W]` → same shape."""
    _check_images(X)
    _check_probability(p, "p")
    flip = _draw((X.shape[0],), None, generator, X.device) < p
    return torch.where(flip[:, None, None, None], X.flip(-1), X)


def pad_to(X: Tensor, size: int = 32, channels: int = 3) -> Tensor:
    """Centre `X` on a zero canvas `size×size` and repeat a single channel `channels` times.

    Turns 28×28 grey MNIST / notMNIST `[B, 1, 28, 28]` into `[B, 3, 32, 32]` OOD inputs for a
    CIFAR model (2 pixels of zeros each side, grey copied to R, G and B).
    """
    _check_images(X)
    batch, c, h, w = X.shape
    if h > size or w > size:
        raise ValueError(f"size: {size} is smaller than the images ({h}×{w})")
    if c not in (1, channels):
        raise ValueError(f"channels: cannot turn {c} channels into {channels} (only 1 → any)")
    top, left = (size - h) // 2, (size - w) // 2
    out = F.pad(X, (left, size - w - left, top, size - h - top))
    return out if c == channels else out.expand(batch, channels, size, size).contiguous()


class Augment:
    """The standard CIFAR training augmentation on batches: random crop, flip, normalise.

    Args:
        padding: `random_crop` padding (0: no crop).
        flip_p: `random_hflip` probability (0: no flip).
        mean, std: per-channel statistics for `normalize`, applied last; None: no normalising.
        seed: seeds a private CPU `torch.Generator` (ignored when `generator` is given).
        generator: the generator to draw from; None and seed None: the global generator.

    Calling it on `[B, C, H, W]` returns a new augmented batch of the same shape.
    """

    def __init__(
        self,
        padding: int = 4,
        flip_p: float = 0.5,
        mean: Stat | None = None,
        std: Stat | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if (mean is None) != (std is None):
            raise ValueError("mean, std: give both or neither")
        _check_padding(padding)
        _check_probability(flip_p, "flip_p")
        if generator is None and seed is not None:
            generator = torch.Generator().manual_seed(int(seed))
        self.padding, self.flip_p = padding, flip_p
        self.mean, self.std = mean, std
        self.generator = generator

    def __call__(self, X: Tensor) -> Tensor:
        if self.padding:
            X = random_crop(X, self.padding, self.generator)
        if self.flip_p:
            X = random_hflip(X, self.flip_p, self.generator)
        if self.mean is not None and self.std is not None:
            X = normalize(X, self.mean, self.std)
        return X

    def __repr__(self) -> str:
        return (
            f"Augment(padding={self.padding}, flip_p={self.flip_p}, mean={self.mean}, "
            f"std={self.std})"
        )
