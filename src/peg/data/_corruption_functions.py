"""The corruptions of `peg.data.corruptions` as functions on image arrays: here noise, the
defocus, Gaussian and box blurs, photometric (contrast, brightness, saturation) and the Pillow
ones (pixelate, JPEG); glass, motion and zoom blur and the elastic transform in
`peg.data._corruption_blur`; frost, fog, snow and spatter in `peg.data._corruption_weather`.
`peg.data._corruption_records` names every function with its parameters.

Every function takes (images `[N, C, H, W]` float32 in [0, 1], a NumPy generator, the spatial
scale s = min(H, W) / 32, and its parameters at one severity by name) and returns the corrupted
images before clipping. The parameters, the scaling to other image sizes and the deviations
from the reference code are described in `peg.data.corruptions`.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from peg.utils.imports import lazy_module

ndimage = lazy_module("scipy.ndimage")  # imported on first use (peg.utils.imports)

Array = np.ndarray


# ---------------------------------------------------------------- noise (vectorised)


def gaussian_noise(x: Array, rng: np.random.Generator, scale: float, *, sigma: float) -> Array:
    return x + sigma * rng.standard_normal(x.shape, dtype=np.float32)


def shot_noise(x: Array, rng: np.random.Generator, scale: float, *, photons: float) -> Array:
    return (rng.poisson(x * np.float64(photons)) / photons).astype(np.float32)


def impulse_noise(x: Array, rng: np.random.Generator, scale: float, *, amount: float) -> Array:
    # One uniform per value (skimage's s&p draws two arrays, which would tie each image's
    # noise to N): below amount/2 salt, up to amount pepper.
    u = rng.random(x.shape, dtype=np.float32)
    out = x.copy()
    out[u < amount / 2] = 1.0
    out[(u >= amount / 2) & (u < amount)] = 0.0
    return out


def speckle_noise(x: Array, rng: np.random.Generator, scale: float, *, sigma: float) -> Array:
    return x + x * (sigma * rng.standard_normal(x.shape, dtype=np.float32))


# ---------------------------------------------------------------- blurs (vectorised)


def gaussian_taps(sigma: float) -> Array:
    """OpenCV's 3-tap Gaussian kernel for `sigma` (what `cv2.GaussianBlur(ksize=3)` uses)."""
    w = np.exp(-(np.arange(-1.0, 2.0) ** 2) / (2 * sigma**2))
    return w / w.sum()


def reference_disk(radius: float, alias_blur: float) -> Array:
    """CIFAR-10-C's defocus kernel at 32×32: a pixel-centre disk, blurred to anti-alias.

    Returns the kernel `[k, k]`, zero rows and columns trimmed, summing to 1.
    """
    grid = np.arange(-8, 9, dtype=np.float64)  # the reference's support (radius <= 8)
    disk = (grid[:, None] ** 2 + grid[None, :] ** 2 <= radius**2).astype(np.float64)
    disk /= disk.sum()
    taps = gaussian_taps(alias_blur)
    kernel = ndimage.correlate1d(disk, taps, axis=0, mode="mirror")
    kernel = ndimage.correlate1d(kernel, taps, axis=1, mode="mirror")
    keep = np.flatnonzero(kernel.sum(axis=0) > 0)
    half = int(np.max(np.abs(keep - 8)))
    return kernel[8 - half : 9 + half, 8 - half : 9 + half]


def resample_kernel(kernel: Array, scale: float) -> Array:
    """Kernel `[k, k]` on pixels `scale` times as large (area overlap), normalised.

    The reference kernel's taps are read as unit squares, stretched by `scale`, and each
    output tap collects the area it covers; `scale = 1` returns the kernel unchanged.
    """
    if scale == 1.0:
        return kernel
    half = kernel.shape[0] // 2
    src = np.arange(-half, half + 1, dtype=np.float64)
    out_half = int(np.ceil((half + 0.5) * scale - 0.5))
    dst = np.arange(-out_half, out_half + 1, dtype=np.float64)
    lo = np.maximum(scale * (src - 0.5)[None, :], (dst - 0.5)[:, None])
    hi = np.minimum(scale * (src + 0.5)[None, :], (dst + 0.5)[:, None])
    overlap = np.clip(hi - lo, 0.0, None)  # [out taps, reference taps], per axis
    out = overlap @ kernel @ overlap.T
    return out / out.sum()


def defocus_blur(
    x: Array, rng: np.random.Generator, scale: float, *, radius: float, alias_blur: float
) -> Array:
    kernel = resample_kernel(reference_disk(radius, alias_blur), scale).astype(np.float32)
    return ndimage.correlate(x, kernel[None, None], mode="mirror")


def gaussian_blur(x: Array, rng: np.random.Generator, scale: float, *, sigma: float) -> Array:
    return ndimage.gaussian_filter(x, sigma=(0, 0, sigma * scale, sigma * scale), mode="nearest")


def box_taps(width: float) -> Array:
    """Centred box of `width` px as taps: each tap weighs the part of it the box covers."""
    half = int(np.ceil(width / 2 - 0.5))
    t = np.arange(-half, half + 1, dtype=np.float64)
    covered = np.minimum(t + 0.5, width / 2) - np.maximum(t - 0.5, -width / 2)
    w = np.clip(covered, 0.0, None)
    return (w / w.sum()).astype(np.float32)


def box_blur(x: Array, rng: np.random.Generator, scale: float, *, width: float) -> Array:
    taps = box_taps(width * scale)
    out = ndimage.correlate1d(x, taps, axis=2, mode="reflect")
    return ndimage.correlate1d(out, taps, axis=3, mode="reflect")


# ---------------------------------------------------------------- photometric (vectorised)


def contrast(x: Array, rng: np.random.Generator, scale: float, *, factor: float) -> Array:
    means = x.mean(axis=(2, 3), keepdims=True)
    return (x - means) * np.float32(factor) + means


def brightness(x: Array, rng: np.random.Generator, scale: float, *, shift: float) -> Array:
    # HSV: V = max over channels. Same H and S with V' = min(V + c, 1) is the pixel scaled by
    # V'/V (black pixels, S = 0, become grey V'). For one channel this is x + c.
    v = x.max(axis=1, keepdims=True)
    v_new = np.minimum(v + np.float32(shift), 1.0)
    ratio = np.divide(v_new, v, out=np.zeros_like(v), where=v > 0)
    return np.where(v > 0, x * ratio, v_new)


def saturate(x: Array, rng: np.random.Generator, scale: float, *, a: float, b: float) -> Array:
    # HSV with V = max, S = (V - min) / V. Keeping H and V, each channel's distance below V is
    # proportional to S, so it is scaled by S'/S. Grey pixels (S = 0) have hue 0 in skimage:
    # they become (V, V(1 - S'), V(1 - S')), as in CIFAR-10-C.
    v = x.max(axis=1, keepdims=True)
    delta = v - x.min(axis=1, keepdims=True)
    s = np.divide(delta, v, out=np.zeros_like(v), where=v > 0)
    s_new = np.clip(s * np.float32(a) + np.float32(b), 0.0, 1.0)
    ratio = np.divide(s_new, s, out=np.zeros_like(s), where=delta > 0)
    coloured = v - (v - x) * ratio
    grey = np.concatenate([v, v * (1 - s_new), v * (1 - s_new)], axis=1)
    return np.where(delta > 0, coloured, grey)


# ---------------------------------------------------------------- Pillow (per image)


def pixelate(x: Array, rng: np.random.Generator, scale: float, *, factor: float) -> Array:
    n, c, h, w = x.shape
    small = (max(1, int(w * factor)), max(1, int(h * factor)))  # Pillow sizes are (W, H)
    out = np.empty_like(x)
    for i in range(n):
        for j in range(c):
            image = Image.fromarray(x[i, j])  # float32 → mode "F": no 8-bit rounding
            image = image.resize(small, Image.Resampling.BOX)
            out[i, j] = np.asarray(image.resize((w, h), Image.Resampling.NEAREST))
    return out


def jpeg_compression(x: Array, rng: np.random.Generator, scale: float, *, quality: int) -> Array:
    pixels = np.round(x * 255.0).astype(np.uint8)
    pixels = pixels[:, 0] if x.shape[1] == 1 else pixels.transpose(0, 2, 3, 1)  # Pillow layout
    out = np.empty(pixels.shape, dtype=np.uint8)
    for i, image in enumerate(pixels):
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=int(quality))
        buffer.seek(0)
        with Image.open(buffer) as decoded:
            out[i] = np.asarray(decoded)
    out = out[:, None] if x.shape[1] == 1 else out.transpose(0, 3, 1, 2)
    return out.astype(np.float32) / 255.0
