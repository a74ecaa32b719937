"""Shifted test sets: CIFAR-10-C-style corruptions at severities 1–5, and rotations.

    from peg.data import corruptions as cc
    X, y = peg.data.load("fashion-mnist", "test")         # [10000, 1, 28, 28] in [0, 1]
    X_noisy = cc.corrupt(X, "gaussian_noise", severity=3)  # same shape and dtype, in [0, 1]
    X_cached = cc.corrupted(X, "pixelate", 5, seed=0)      # computed once, then read from disk
    for name, severity, X_shift in cc.shifted_sets(X): ...
    X_rot = cc.rotate(X, 45)                               # counter-clockwise, as displayed

Written with NumPy, SciPy and Pillow only, after Hendrycks & Dietterich (2019), "Benchmarking
neural network robustness to common corruptions and perturbations", and its reference code
(`hendrycks/robustness`, `ImageNet-C/create_c/make_cifar_c.py`). The 32×32 parameters are the
CIFAR-10-C ones from that script (all 19 of its corruptions), plus our `box_blur`; each
corruption is one record of `peg.data._corruption_records` (its function, its parameters by
name, its channels), and this table is rendered from them:

{table}

Other image sizes (28×28 for the MNIST family) scale the *spatial* parameters by
s = min(H, W) / 32 (0.875 for 28×28), so a corruption covers the same fraction of the image:
Gaussian σ (also glass blur's), box widths and motion-blur radius and σ are multiplied by s,
glass blur's shift δ becomes max(1, round(δ·s)); the defocus kernel is the reference 32×32
kernel resampled by area to pixels s times as large (exactly the reference at s = 1; a
scaled radius alone would collapse the 1-px disk of severity 4 to a single pixel);
pixelate factors and zooms are already relative (28×28 → 26, 25, 23, 21, 18 px), elastic
parameters are fractions of the side (the reference's IMSIZE), and the weather layers (frost
crop, fog fractal, snow flakes, liquid) are made at the 32×32 geometry and resized (Pillow
bilinear). Noise levels, contrast, brightness, saturation and JPEG quality stay unchanged.

Details and deviations from the reference, all deliberate:
- Inputs are floats; only JPEG quantises to 8 bits (pixelate runs on float images), and
  spatter's liquid level, whose 8-bit values its Canny thresholds are set for. The
  reference's other 8-bit steps (glass blur's, PNG round trips around ImageMagick) are not.
- The mean in `contrast` is per image and channel, as in the reference.
- `brightness` and `saturate` edit HSV exactly as skimage's rgb2hsv/hsv2rgb would, in closed
  form: brightness scales a pixel's RGB by V'/V; saturate moves each channel towards or away
  from V. Grey pixels under `saturate` with b > 0 turn reddish (skimage gives them hue 0),
  as in CIFAR-10-C. For 1-channel images brightness is additive (V is the grey value) and
  `saturate` raises ValueError (grey images have no saturation; `shifted_sets` skips it).
- Grey images under frost, fog, snow and spatter are corrupted as their RGB copy, then
  turned back to one channel by BT.601 luma (for fog and snow, the same as on the grey).
- ImageMagick's motion blur (motion_blur, snow) is rewritten in NumPy as it computes it: a
  line of 2·ceil(radius) + 1 one-sided Gaussian taps exp(-i²/2σ²) at (round(i·cos a),
  round(i·sin a)), edges replicated. So severities 3 and 4 of motion_blur are one blur (σ = 2;
  taps past 12 weigh < e⁻¹⁸), with different angles.
- glass_blur's pixel "swap" is, in the reference, a tuple assignment of numpy views, which
  copies (numpy/numpy#14428); it is reproduced, in its sequential order, one step for all
  images at once (10k 32×32 RGB images: 3–6 s on one shared core).
- frost uses the five photographs of the PyPI package torch-uncertainty-assets 0.5.2 (a
  dependency, checked by SHA-256). The reference lists six files but draws randint(5): the
  first five. The crop is random; the photograph is shrunk by 5 as cv2.resize does.
- spatter reimplements OpenCV's Canny, equalizeHist and filters; its distance to the edges is
  the exact Euclidean one (`scipy.ndimage.distance_transform_edt`), not cv2's 5×5 mask.
- Not monotone in the amount of change (mean |corrupted − clean|), by the reference design:
  `saturate` (1–2 desaturate, 3–5 oversaturate); glass_blur (two passes from 4; σ ≤ .25
  barely blurs); snow and spatter (parameters not ordered; spatter is water, then mud);
  elastic_transform (its affine shift shrinks as the elastic part grows, and the affine
  dominates at 32 px); frost (c0 falls as c1 rises, so |c1·frost − (1 − c0)·x| can shrink).
- Border handling follows the reference libraries: defocus `mirror` (OpenCV's default),
  Gaussian `nearest` (skimage's), box `reflect` (so a box of odd integer width w equals
  `scipy.ndimage.uniform_filter(size=w)`; fractional widths give the edge taps the covered
  fraction, and even widths stay centred).

Randomness (noise, glass, motion, snow, frost, fog, spatter, elastic) comes from
`np.random.default_rng([seed, crc32(name), severity])`, drawn image by image in order (all
but the noises give each image its own generator seeded from it), so the result depends only
on (seed, name, severity) and the images, and `corrupt(X[:k]) == corrupt(X)[:k]`.

Caching: `corrupted` and `shifted_sets(cache=True)` keep results as `.npy` files under
`cache_dir`, else `$PEG_CACHE/corruptions`, else `~/.cache/peg/corruptions`, keyed by (key or a
hash of X, name, severity, seed, a code version); writes are atomic (temporary file, rename).

The corruption functions are in `peg.data._corruption_functions` (with `_corruption_blur` and
`_corruption_weather`), their records in `peg.data._corruption_records`; this module holds the
argument checks (one place: `_arguments`), the cache and the iterators over shifted sets.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from peg.data._corruption_cache import (
    cache_root,
    check_key,
    images_digest,
    read_cache,
    write_cache,
)
from peg.data._corruption_records import BY_NAME, RECORDS, Array, table
from peg.utils.imports import lazy_module
from peg.utils.scalars import check_seed

ndimage = lazy_module("scipy.ndimage")  # imported on first use (peg.utils.imports)

__doc__ = (__doc__ or "").replace("{table}", table())

#: Severities of every corruption.
SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)
#: Rotated-MNIST protocol angles, in degrees.
ROTATION_ANGLES: tuple[int, ...] = tuple(range(0, 181, 15))

_REFERENCE_SIZE = 32  # the parameters below are CIFAR-10-C's, for 32×32 images
# Bump when any corruption changes: it is part of every cache file's name.
_CACHE_VERSION = 1

#: Names of the corruptions, in a fixed order.
CORRUPTIONS: tuple[str, ...] = tuple(r.name for r in RECORDS)


# ---------------------------------------------------------------- argument checks


def _check_images(X: Any) -> tuple[Array, torch.dtype, torch.device]:
    """X `[N, C, H, W]` float in [0, 1], C in {1, 3} → (float32 array, dtype, device)."""
    if not isinstance(X, (Tensor, np.ndarray)):
        raise ValueError(f"X: expected a tensor or array [N, C, H, W], got {type(X).__name__}")
    t = torch.as_tensor(X)
    if t.ndim != 4:
        raise ValueError(f"X: expected 4 dimensions [N, C, H, W], got shape {tuple(t.shape)}")
    if not torch.is_floating_point(t):
        raise ValueError(f"X: expected floating-point images in [0, 1], got dtype {t.dtype}")
    if t.shape[1] not in (1, 3):
        raise ValueError(f"X: expected 1 (grey) or 3 (RGB) channels, got shape {tuple(t.shape)}")
    if t.shape[2] < 1 or t.shape[3] < 1:
        raise ValueError(f"X: expected non-empty images, got shape {tuple(t.shape)}")
    x = np.ascontiguousarray(t.detach().cpu().to(torch.float32).numpy())
    if x.size and not np.isfinite(x).all():
        raise ValueError("X: expected values in [0, 1], got NaN or infinite values")
    if x.size and not (x.min() >= 0.0 and x.max() <= 1.0):
        raise ValueError(f"X: expected values in [0, 1], got range [{x.min()}, {x.max()}]")
    return x, t.dtype, t.device


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or name not in BY_NAME:
        raise ValueError(f"name: unknown corruption {name!r}; known: {', '.join(CORRUPTIONS)}")
    return name


def _check_severity(severity: Any) -> int:
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)):
        raise ValueError(f"severity: expected an integer in 1..5, got {severity!r}")
    if severity not in SEVERITIES:
        raise ValueError(f"severity: expected an integer in 1..5, got {severity!r}")
    return int(severity)


class _Arguments(NamedTuple):
    x: Array  # float32 [N, C, H, W]
    dtype: torch.dtype
    device: torch.device
    names: tuple[str, ...]
    severities: tuple[int, ...]
    seed: int


def _arguments(
    X: Any, names: str | Iterable[str] | None, severities: Iterable[int], seed: Any
) -> _Arguments:
    """Every argument of `corrupt`, `corrupted` and `shifted_sets` checked, in one place, before
    any work: the images, the corruptions (default: all that apply to X's channels), whether
    each applies (and has what it needs: frost its photographs), the severities, the seed."""
    x, dtype, device = _check_images(X)
    channels = x.shape[1]
    names = (names,) if isinstance(names, str) else names
    chosen = applicable(channels) if names is None else tuple(_check_name(n) for n in names)
    levels = tuple(_check_severity(s) for s in severities)
    seed = check_seed(seed)
    for name in chosen:
        record = BY_NAME[name]
        if channels not in record.channels:
            raise ValueError(
                f"X: {name} needs RGB images (3 channels), got {channels}; grey images have no "
                "saturation to change"
            )
        if record.needs is not None:
            record.needs()  # e.g. frost's photographs, a package: missing, it fails here
    return _Arguments(x, dtype, device, chosen, levels, seed)


def _to_tensor(x: Array, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(device, dtype)


# ---------------------------------------------------------------- public API


def _compute(x: Array, name: str, severity: int, seed: int) -> Array:
    """The corruption of checked images `x` `[N, C, H, W]` float32 → float32 in [0, 1]."""
    if x.shape[0] == 0:
        return x.copy()
    rng = np.random.default_rng([seed, zlib.crc32(name.encode()), severity])
    scale = min(x.shape[2], x.shape[3]) / _REFERENCE_SIZE
    record = BY_NAME[name]
    out = record.function(x, rng, scale, **record.at(severity))
    return np.clip(out, 0.0, 1.0).astype(np.float32, copy=False)


def corrupt(X: Tensor | Array, name: str, severity: int, seed: int = 0) -> Tensor:
    """Apply corruption `name` at `severity` to a batch of images.

    Args:
        X: images `[N, C, H, W]`, floating point in [0, 1], C = 1 (grey) or 3 (RGB).
        name: one of `CORRUPTIONS`.
        severity: 1 (mild) .. 5 (strong).
        seed: seed of the noise corruptions (the others are deterministic).

    Returns:
        The corrupted images `[N, C, H, W]`, clipped to [0, 1], with X's dtype and device.

    Raises:
        ValueError: unknown name (the message lists the known ones), severity not in 1..5, a
            negative seed, X not 4-D floating point in [0, 1] with 1 or 3 channels, or
            `saturate` on grey images.
    """
    a = _arguments(X, (name,), (severity,), seed)
    return _to_tensor(_compute(a.x, name, a.severities[0], a.seed), a.dtype, a.device)


def images_key(X: Tensor | Array) -> str:
    """A content key of images X: SHA-256 (first 24 hex digits) of shape and float32 bytes."""
    x, _, _ = _check_images(X)
    return images_digest(x)


def _corrupted(
    x: Array, name: str, severity: int, seed: int, folder: Path, key: str
) -> tuple[Array, Path]:
    path = folder / f"{key}_{name}_s{severity}_seed{seed}_v{_CACHE_VERSION}.npy"
    cached = read_cache(path, x.shape)
    if cached is not None:
        return cached, path
    out = _compute(x, name, severity, seed)
    write_cache(path, out)
    return out, path


def corrupted(
    X: Tensor | Array,
    name: str,
    severity: int,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    key: str | None = None,
) -> Tensor:
    """`corrupt(X, name, severity, seed)`, cached on disk as `.npy`.

    The file is `<cache_root(cache_dir)>/<key>_<name>_s<severity>_seed<seed>_v<version>.npy`;
    it is written atomically and read with `allow_pickle=False`. A file that is unreadable or
    of another shape is recomputed and replaced.

    Args:
        X, name, severity, seed: as for `corrupt`.
        cache_dir: cache folder; default `$PEG_CACHE/corruptions` or `~/.cache/peg/corruptions`.
        key: names X in the file name (characters [A-Za-z0-9._-]), e.g. "fashion-mnist-test";
            default `images_key(X)`, a hash of X's contents. A key must identify X's contents:
            the cache trusts it.

    Returns:
        The corrupted images `[N, C, H, W]` in [0, 1], with X's dtype and device.
    """
    a = _arguments(X, (name,), (severity,), seed)
    key = images_digest(a.x) if key is None else check_key(key)
    out, _ = _corrupted(a.x, name, a.severities[0], a.seed, cache_root(cache_dir), key)
    return _to_tensor(out, a.dtype, a.device)


def applicable(channels: int) -> tuple[str, ...]:
    """The corruptions that apply to images with `channels` channels (1: all but saturate)."""
    if channels not in (1, 3):
        raise ValueError(f"channels: expected 1 or 3, got {channels!r}")
    return tuple(r.name for r in RECORDS if channels in r.channels)


def shifted_sets(
    X: Tensor | Array,
    names: str | Iterable[str] | None = None,
    severities: Sequence[int] = SEVERITIES,
    seed: int = 0,
    cache: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    key: str | None = None,
) -> Iterator[tuple[str, int, Tensor]]:
    """Every (corruption, severity) version of X, one at a time (arguments checked at once).

    Args:
        X: images `[N, C, H, W]` in [0, 1].
        names: a corruption or several; default `applicable(C)` (all; grey X: no saturate).
        severities: subset of 1..5.
        seed: as for `corrupt`.
        cache, cache_dir, key: cache on disk as `corrupted` does (`cache_dir` implies it).

    Yields:
        `(name, severity, X_shifted)`, X_shifted `[N, C, H, W]` with X's dtype and device.
    """
    a = _arguments(X, names, severities, seed)
    use_cache = cache or cache_dir is not None
    if use_cache:
        key = images_digest(a.x) if key is None else check_key(key)
    folder = cache_root(cache_dir)

    def generate() -> Iterator[tuple[str, int, Tensor]]:
        for name in a.names:
            for severity in a.severities:
                if use_cache:
                    out, _ = _corrupted(a.x, name, severity, a.seed, folder, str(key))
                else:
                    out = _compute(a.x, name, severity, a.seed)
                yield name, severity, _to_tensor(out, a.dtype, a.device)

    return generate()


def _check_degrees(degrees: Any) -> float:
    if isinstance(degrees, bool) or not isinstance(degrees, (int, float, np.integer, np.floating)):
        raise ValueError(f"degrees: expected a real number, got {degrees!r}")
    if not np.isfinite(degrees):
        raise ValueError(f"degrees: expected a finite number, got {degrees!r}")
    return float(degrees)


def rotate(X: Tensor | Array, degrees: float) -> Tensor:
    """Rotate images counter-clockwise (as displayed, rows top-down) by `degrees`.

    Bilinear (`scipy.ndimage.rotate`, order=1, reshape=False) about the image centre; corners
    brought in from outside are 0 (the MNIST background). `rotate(X, 90)` is
    `torch.rot90(X, 1, dims=(2, 3))` for square images.

    Args:
        X: images `[N, C, H, W]` in [0, 1].
        degrees: angle; the rotated-MNIST protocol uses `ROTATION_ANGLES` (0, 15, ..., 180).

    Returns:
        Rotated images `[N, C, H, W]` in [0, 1], with X's dtype and device.
    """
    x, dtype, device = _check_images(X)
    degrees = _check_degrees(degrees)
    if degrees % 360.0 == 0.0 or x.shape[0] == 0:
        return _to_tensor(x.copy(), dtype, device)  # a copy: never an alias of X
    out = ndimage.rotate(x, degrees, axes=(2, 3), reshape=False, order=1, mode="constant")
    return _to_tensor(np.clip(out, 0.0, 1.0), dtype, device)


def rotated_sets(
    X: Tensor | Array, angles: Iterable[float] = ROTATION_ANGLES
) -> Iterator[tuple[float, Tensor]]:
    """`(angle, rotate(X, angle))` for each angle, one at a time (rotated-MNIST protocol)."""
    _check_images(X)
    angles = tuple(angles)
    for a in angles:
        _check_degrees(a)
    return ((a, rotate(X, a)) for a in angles)
