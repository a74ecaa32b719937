"""Frost, fog, snow and spatter of `peg.data.corruptions`, with the image operations they need
(the diamond-square plasma fractal, OpenCV's Canny edges and histogram equalisation).

Each corruption takes (images `[N, C, H, W]` float32 in [0, 1], its parameter at one severity,
a NumPy generator, the spatial scale s = min(H, W) / 32) and returns the corrupted images. Its
layer (frost crop, fog fractal, snow flakes, liquid) is made at the 32×32 reference geometry and
resized to the image, so it covers the same fraction of any image size. Grey images are
corrupted as their RGB copy (R = G = B), then brought back to one channel by luma (ITU-R BT.601,
0.299 R + 0.587 G + 0.114 B, the reference's `cv2.COLOR_RGB2GRAY`). Parameters and deviations
from the reference (`hendrycks/robustness`, `ImageNet-C/create_c/make_cifar_c.py`) are in
`peg.data.corruptions`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import io
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from peg.data._corruption_blur import (
    clipped_zoom,
    image_generators,
    line_blur,
    reference_shape,
    resize,
    sample_bilinear,
)
from peg.utils.imports import lazy_module

ndimage = lazy_module("scipy.ndimage")  # imported on first use (peg.utils.imports)

Array = np.ndarray
# (images [N, C, H, W] float32, generator, spatial scale, **parameters) -> images
Corruption = Callable[..., Array]

LUMA = np.array([0.299, 0.587, 0.114], np.float32)  # ITU-R BT.601
WATER = np.array([175, 238, 238], np.float32) / 255  # pale turquoise (RGB)
MUD = np.array([63, 42, 20], np.float32) / 255  # mud brown (RGB)
_EMBOSS = np.array([[-2, -1, 0], [-1, 1, 1], [0, 1, 2]], np.float64)  # the reference's kernel

FROST_PACKAGE = "torch-uncertainty-assets"
FROST_INSTALL = "pip install torch-uncertainty-assets==0.5.2"
# SHA-256 of frost1.jpg .. frost5.jpg in torch-uncertainty-assets 0.5.2: the photographs define
# the corruption (and its cache), so other files are refused rather than silently used.
_FROST_SHA256 = (
    "14fdc6377405baf7d8a4bd6043cb153fef8a22332bf141c0cf50026ef6ded822",
    "219ca775787e1d20121fb19ab2bf1a632cf04c3304c9c208d5c1bf82da71df2e",
    "3f8b91ca1a9fa7167b09e773da53f5ae60d0a1fd88f02a783f6e328a72887f6e",
    "5fc6a19df4a429ba68abdcc8f8a4278d4c9f81c9ccafd2c92ab0c8cf8992ebd2",
    "1f92b2f48408748085b68dd81d816ef239f42cef3029c25d041fcb6760fb4f25",
)
_FROST_SCALE = 0.2  # the reference shrinks the photographs by 5 for CIFAR (cv2.resize)


def luma(x: Array) -> Array:
    """RGB images `[N, 3, H, W]` → grey `[N, 1, H, W]` (BT.601 weights)."""
    return np.tensordot(LUMA, x, axes=([0], [1]))[:, None]


def via_rgb(corruption: Corruption) -> Corruption:
    """`corruption` for 1 or 3 channels: grey images go through their RGB copy and luma."""

    @functools.wraps(corruption)
    def wrapped(x: Array, rng: np.random.Generator, scale: float, **parameters: Any) -> Array:
        if x.shape[1] == 3:
            return corruption(x, rng, scale, **parameters)
        rgb = corruption(np.repeat(x, 3, axis=1), rng, scale, **parameters)
        return luma(np.clip(rgb, 0.0, 1.0))

    return wrapped


# ---------------------------------------------------------------- frost


@functools.lru_cache(maxsize=1)
def frost_photos() -> tuple[Array, ...]:
    """The five frost photographs of torch-uncertainty-assets 0.5.2 shrunk as the reference
    does for CIFAR (`cv2.resize(fx=fy=0.2)`, bilinear without averaging: every 5th pixel),
    RGB float32 `[h, w, 3]` in [0, 1].

    Raises:
        ModuleNotFoundError: the package is not installed (the message says how to).
        RuntimeError: its photographs are not those of version 0.5.2.
    """
    try:
        folder = importlib.resources.files("torch_uncertainty_assets") / "frost"
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            f"name: 'frost' needs the frost photographs of the package {FROST_PACKAGE}, which "
            f"is not installed; install it with `{FROST_INSTALL}`"
        ) from e
    photos = []
    for i, digest in enumerate(_FROST_SHA256, start=1):
        data = (folder / f"frost{i}.jpg").read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:
            raise RuntimeError(
                f"name: 'frost' needs the photographs of {FROST_PACKAGE} 0.5.2; frost{i}.jpg "
                f"differs from it; install it with `{FROST_INSTALL}`"
            )
        with Image.open(io.BytesIO(data)) as image:
            photo = np.asarray(image.convert("RGB"), np.float32) / 255
        h, w = round(photo.shape[0] * _FROST_SCALE), round(photo.shape[1] * _FROST_SCALE)
        # OpenCV's INTER_LINEAR: output pixel i reads input (i + 0.5) / 0.2 - 0.5 = 5i + 2.
        rows = (np.arange(h) + 0.5) / _FROST_SCALE - 0.5
        cols = (np.arange(w) + 0.5) / _FROST_SCALE - 0.5
        grid = np.meshgrid(rows, cols, indexing="ij")
        small = sample_bilinear(photo.transpose(2, 0, 1)[None], *(g[None] for g in grid), "nearest")
        photos.append(np.ascontiguousarray(small[0].transpose(1, 2, 0)))
    return tuple(photos)


@via_rgb
def frost(x: Array, rng: np.random.Generator, scale: float, *, keep: float, add: float) -> Array:
    # c0·x + c1·frost, the frost a random crop of a random photograph (of 5: the reference
    # lists 6 files but draws randint(5), the first 5; here the package's 5).
    photos = frost_photos()
    n, _, h, w = x.shape
    h0, w0 = reference_shape(h, w, scale)
    crops = []
    for g in image_generators(rng, n):
        photo = photos[g.integers(len(photos))]
        top, left = g.integers(0, photo.shape[0] - h0), g.integers(0, photo.shape[1] - w0)
        crops.append(photo[top : top + h0, left : left + w0].transpose(2, 0, 1))
    layer = resize(np.asarray(crops, np.float32), h, w)
    return np.float32(keep) * x + np.float32(add) * layer


# ---------------------------------------------------------------- fog


def plasma_fractal(noise: Array, size: int, decay: float) -> Array:
    """The reference's diamond-square height maps `[N, size, size]` in [0, 1] (a modification of
    FLHerne/mapgen's diamondsquare.py), wrapping at the edges.

    Args:
        noise: uniforms in [0, 1) `[N, size² - 1]`, consumed in the order of the reference's
            `np.random.uniform` calls (squares, then the two diamond sets, level by level).
        size: a power of two.
        decay: the reference's `wibbledecay`: the noise amplitude's divisor per level.
    """
    n = noise.shape[0]
    m = np.zeros((n, size, size))
    step, wibble, used = size, 100.0, 0

    def noisy_mean(total: Array) -> Array:
        nonlocal used
        k = total[0].size
        u = noise[:, used : used + k].reshape(total.shape)
        used += k
        return total / 4 + wibble * (wibble * (2 * u - 1))  # wibble · U(-wibble, wibble)

    while step >= 2:
        half = step // 2
        corners = m[:, ::step, ::step]
        squares = corners + np.roll(corners, -1, axis=1)
        m[:, half::step, half::step] = noisy_mean(squares + np.roll(squares, -1, axis=2))
        centres, corners = m[:, half::step, half::step], m[:, ::step, ::step]
        left = centres + np.roll(centres, 1, axis=1) + corners + np.roll(corners, -1, axis=2)
        m[:, ::step, half::step] = noisy_mean(left)
        top = centres + np.roll(centres, 1, axis=2) + corners + np.roll(corners, -1, axis=1)
        m[:, half::step, ::step] = noisy_mean(top)
        step, wibble = half, wibble / decay
    m -= m.min(axis=(1, 2), keepdims=True)
    return m / m.max(axis=(1, 2), keepdims=True)


@via_rgb
def fog(x: Array, rng: np.random.Generator, scale: float, *, amount: float, decay: float) -> Array:
    # (x + c0·fractal) · max / (max + c0), max the image's largest value.
    n, _, h, w = x.shape
    h0, w0 = reference_shape(h, w, scale)
    size = 1 << max(1, int(np.ceil(np.log2(max(h0, w0)))))
    noise = np.stack([g.random(size * size - 1) for g in image_generators(rng, n)])
    layer = plasma_fractal(noise, size, decay)[:, None, :h0, :w0]
    layer = resize(layer.astype(np.float32), h, w)
    peak = x.max(axis=(1, 2, 3), keepdims=True)
    return (x + np.float32(amount) * layer) * (peak / (peak + np.float32(amount)))


# ---------------------------------------------------------------- snow


@via_rgb
def snow(
    x: Array,
    rng: np.random.Generator,
    scale: float,
    *,
    loc: float,
    spread: float,
    zoom: float,
    threshold: float,
    radius: float,
    sigma: float,
    mix: float,
) -> Array:
    # Flakes: N(loc, spread) noise, clipped_zoom by `zoom`, values below `threshold` cleared,
    # motion-blurred (radius, sigma, angle U(-135°, -45°)); added with its half-turn rotation
    # to the image brightened towards max(x, 1.5·grey + 0.5) by 1 - mix.
    n, _, h, w = x.shape
    h0, w0 = reference_shape(h, w, scale)
    flakes, angles = [], []
    for g in image_generators(rng, n):
        flakes.append(g.normal(loc, spread, size=(1, h0, w0)))
        angles.append(g.uniform(-135, -45))
    layer = clipped_zoom(np.asarray(flakes, np.float32), zoom)
    layer = np.clip(np.where(layer < threshold, 0.0, layer), 0.0, 1.0).astype(np.float32)
    layer = resize(line_blur(layer, radius, sigma, np.asarray(angles)), h, w)
    bright = np.maximum(x, luma(x) * 1.5 + 0.5)
    x = np.float32(mix) * x + np.float32(1 - mix) * bright
    return x + layer + np.rot90(layer, 2, axes=(2, 3))


# ---------------------------------------------------------------- spatter


def canny(image: Array, low: float, high: float) -> Array:
    """OpenCV's `cv2.Canny(image, low, high)` of 8-bit images `[N, h, w]` → edges (bool).

    3×3 Sobel with replicated borders, L1 magnitude |gx| + |gy|, non-maximum suppression in
    OpenCV's four directions (its strict / non-strict comparisons), hysteresis: pixels above
    `low` that are local maxima, kept when 8-connected to one above `high`.
    """
    img = image.astype(np.int64)

    def sobel(axis: int) -> Array:
        other = 3 - axis  # the spatial axis the derivative smooths along
        smooth = ndimage.correlate1d(img, [1, 2, 1], axis=other, mode="nearest")
        return ndimage.correlate1d(smooth, [-1, 0, 1], axis=axis, mode="nearest")

    gx, gy = sobel(2), sobel(1)
    mag = np.abs(gx) + np.abs(gy)
    pad = np.pad(mag, ((0, 0), (1, 1), (1, 1)))  # zero outside, as OpenCV's buffer

    def near(dr: int, dc: int) -> Array:
        return pad[:, 1 + dr : pad.shape[1] - 1 + dr, 1 + dc : pad.shape[2] - 1 + dc]

    tan = np.tan(np.pi / 8)
    ax, ay = np.abs(gx), np.abs(gy)
    same_sign = (gx < 0) == (gy < 0)
    diagonal = np.where(
        same_sign,
        (mag > near(-1, -1)) & (mag > near(1, 1)),
        (mag > near(-1, 1)) & (mag > near(1, -1)),
    )
    local = np.where(
        ay < ax * tan,
        (mag > near(0, -1)) & (mag >= near(0, 1)),
        np.where(ay > ax * (tan + 2), (mag > near(-1, 0)) & (mag >= near(1, 0)), diagonal),
    )
    candidate = local & (mag > low)
    structure = np.zeros((3, 3, 3), bool)
    structure[1] = True  # 8-connected within an image, never across images
    labels, _ = ndimage.label(candidate, structure=structure)
    strong = np.unique(labels[candidate & (mag > high)])
    return np.isin(labels, strong[strong > 0])


def equalize_hist(image: Array) -> Array:
    """OpenCV's `cv2.equalizeHist` of 8-bit images `[N, h, w]` (integer values)."""
    n = image.shape[0]
    flat = image.reshape(n, -1).astype(np.intp)
    hist = np.bincount((flat + 256 * np.arange(n)[:, None]).ravel(), minlength=256 * n)
    hist = hist.reshape(n, 256)
    rows = np.arange(n)
    base = hist[rows, (hist > 0).argmax(axis=1)]  # count of the darkest value present
    spread = np.maximum(flat.shape[1] - base, 1)[:, None]
    lut = np.rint(np.clip((hist.cumsum(axis=1) - base[:, None]) * (255 / spread), 0, 255))
    constant = base == flat.shape[1]  # one value only: OpenCV leaves it as it is
    lut[constant] = np.arange(256)
    return np.take_along_axis(lut, flat, axis=1).reshape(image.shape)


def water(liquid: Array) -> Array:
    """The reference's water drops `[N, h, w]` in [0, 1] from the liquid layer: shading from the
    distance to the drops' Canny edges (truncated at 20 px, box-blurred, equalised, embossed,
    box-blurred again) times the liquid, over its maximum."""
    level = np.floor(np.clip(liquid, 0.0, 1.0) * 255)  # the reference's uint8 layer
    edges = canny(level, 50, 150)
    dist = np.full(level.shape, 20.0)
    for i in np.flatnonzero(edges.any(axis=(1, 2))):
        dist[i] = np.minimum(ndimage.distance_transform_edt(~edges[i]), 20.0)
    box = (1, 3, 3)
    dist = np.floor(ndimage.uniform_filter(dist, size=box, mode="mirror"))  # astype(uint8)
    dist = equalize_hist(dist)
    dist = np.clip(ndimage.correlate(dist, _EMBOSS[None], mode="mirror"), 0, 255)
    dist = np.rint(ndimage.uniform_filter(dist, size=box, mode="mirror"))  # 8-bit box blur
    m = level * dist
    peak = m.max(axis=(1, 2), keepdims=True)
    return np.divide(m, peak, out=np.zeros_like(m), where=peak > 0)


@via_rgb
def spatter(
    x: Array,
    rng: np.random.Generator,
    scale: float,
    *,
    loc: float,
    spread: float,
    sigma: float,
    threshold: float,
    strength: float,
    is_mud: int,
) -> Array:
    # Liquid: N(loc, spread) noise, Gaussian-blurred (σ), values below `threshold` cleared.
    # Severities 1-3: water, x + strength · drops · pale turquoise; 4-5: mud, the liquid mask
    # blurred (σ = strength), below 0.8 cleared, blended over x in mud brown.
    n, _, h, w = x.shape
    h0, w0 = reference_shape(h, w, scale)
    liquid = np.stack([g.normal(loc, spread, size=(h0, w0)) for g in image_generators(rng, n)])
    liquid = ndimage.gaussian_filter(liquid, sigma=(0, sigma, sigma), mode="nearest")
    liquid[liquid < threshold] = 0.0
    if not is_mud:
        layer = resize(np.float32(strength) * water(liquid)[:, None].astype(np.float32), h, w)
        return x + layer * WATER[None, :, None, None]
    mask = (liquid > threshold).astype(np.float64)
    mask = ndimage.gaussian_filter(mask, sigma=(0, strength, strength), mode="nearest")
    mask[mask < 0.8] = 0.0
    layer = resize(mask[:, None].astype(np.float32), h, w)
    return x * (1 - layer) + layer * MUD[None, :, None, None]
