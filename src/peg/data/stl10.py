"""STL-10 from the binary release, optionally resized and relabelled as CIFAR-10.

`stl10_binary/{train,test}_X.bin` hold uint8 images `[N, 3, 96, 96]` written column-major
(each channel is stored transposed, as MATLAB writes it), `{train,test}_y.bin` uint8 labels
1..10 (5,000 training and 8,000 test images; the unlabeled split is not read).

For transfer to a CIFAR-10 model (the SWAG paper's STL-10 experiment), `cifar_classes=True`
drops STL's "monkey" class and renumbers the other nine to CIFAR-10's indices ("car" becomes
"automobile"; CIFAR's "frog" has no images), and `size=32` downsamples to CIFAR's resolution.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from peg.data._cache import check_split, find_first, not_found
from peg.data.roots import PathLike

#: STL-10's classes in its label order (after subtracting 1).
STL10_CLASSES: tuple[str, ...] = (
    "airplane",
    "bird",
    "car",
    "cat",
    "deer",
    "dog",
    "horse",
    "monkey",
    "ship",
    "truck",
)
#: STL-10 label -> CIFAR-10 label (-1: monkey, no CIFAR-10 counterpart).
STL10_TO_CIFAR10: tuple[int, ...] = (0, 2, 1, 3, 4, 5, 7, -1, 8, 9)
_SIDE = 96
_CHUNK = 512  # images converted/resized at a time, to bound the float32 working memory
_HINT = (
    "Put the STL-10 binary release (stl10_binary.tar.gz extracted: stl10_binary/train_X.bin, "
    "train_y.bin, test_X.bin, test_y.bin) under $PEG_DATA (or pass root=). Nothing is downloaded."
)


def _read(images_path: Path, labels_path: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images `[N, 3, 96, 96]` uint8 (a view, row-major), labels `[N]` int64 in 0..9."""
    raw = np.fromfile(images_path, dtype=np.uint8)
    per_image = 3 * _SIDE * _SIDE
    if raw.size == 0 or raw.size % per_image:
        raise ValueError(
            f"{images_path}: {raw.size} bytes is not a whole number of {per_image}-byte images"
        )
    labels = np.fromfile(labels_path, dtype=np.uint8).astype(np.int64)
    if labels.size != raw.size // per_image:
        raise ValueError(
            f"{images_path.parent}: {raw.size // per_image} images but {labels.size} labels "
            f"({split}_X.bin, {split}_y.bin)"
        )
    if labels.size and (labels.min() < 1 or labels.max() > 10):
        raise ValueError(
            f"{labels_path}: expected labels 1..10, got {labels.min()}..{labels.max()}"
        )
    # column-major storage: each [96, 96] channel is transposed
    images = raw.reshape(-1, 3, _SIDE, _SIDE).transpose(0, 1, 3, 2)
    return images, labels - 1


def _to_float(images: np.ndarray, size: int) -> Tensor:
    """uint8 `[N, 3, 96, 96]` → float32 `[N, 3, size, size]` in [0, 1], in chunks."""
    out = torch.empty((len(images), 3, size, size), dtype=torch.float32)
    for start in range(0, len(images), _CHUNK):
        chunk = torch.from_numpy(np.ascontiguousarray(images[start : start + _CHUNK]))
        chunk = chunk.to(torch.float32).div_(255.0)
        if size != _SIDE:
            # antialiased bilinear, as Pillow's resize does; clamp the small overshoot
            chunk = F.interpolate(
                chunk, size=(size, size), mode="bilinear", antialias=True, align_corners=False
            ).clamp_(0.0, 1.0)
        out[start : start + len(chunk)] = chunk
    return out


def load_stl10(
    split: str,
    root: PathLike | Sequence[PathLike] | None = None,
    size: int = _SIDE,
    cifar_classes: bool = False,
) -> tuple[Tensor, Tensor]:
    """STL-10 `(X [N, 3, size, size] float32 in [0, 1], y [N] int64)`.

    Args:
        split: "train" (5,000) or "test" (8,000).
        root: data root(s) searched first.
        size: output side in pixels; 96 keeps the originals, e.g. 32 resizes (antialiased
            bilinear) to CIFAR's resolution.
        cifar_classes: drop the monkey images (800 test, 500 train) and use CIFAR-10's label
            indices (see `STL10_TO_CIFAR10`).
    """
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"size: expected a positive integer side in pixels, got {size!r}")
    if not isinstance(cifar_classes, bool):
        raise ValueError(f"cifar_classes: expected True or False, got {cifar_classes!r}")
    check_split(split)
    found = find_first([f"stl10_binary/{split}_X.bin"], root)
    if found is None:
        raise not_found("stl10", split, root, _HINT)
    images_path = found[0]
    labels_path = images_path.with_name(f"{split}_y.bin")
    if not labels_path.exists():
        raise FileNotFoundError(f"{labels_path} is missing (next to {images_path.name})")
    images, labels = _read(images_path, labels_path, split)
    if cifar_classes:
        mapped = np.asarray(STL10_TO_CIFAR10, dtype=np.int64)[labels]
        keep = mapped >= 0
        images, labels = images[keep], mapped[keep]
    return _to_float(images, int(size)), torch.from_numpy(labels)
