"""Glass, motion and zoom blur and the elastic transform of `peg.data.corruptions`, and the
sampling helpers they share with the weather corruptions (`peg.data._corruption_weather`).

Each corruption takes (images `[N, C, H, W]` float32 in [0, 1], its parameter at one severity,
a NumPy generator, the spatial scale s = min(H, W) / 32) and returns the corrupted images before
clipping. The random ones give every image its own generator (`image_generators`), drawn in the
reference's order, so image i depends only on (seed, name, severity, i). Parameters, scaling and
the deviations from the reference (`hendrycks/robustness`, `ImageNet-C/create_c/
make_cifar_c.py`) are described in `peg.data.corruptions`.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from peg.utils.imports import lazy_module

ndimage = lazy_module("scipy.ndimage")  # imported on first use (peg.utils.imports)

Array = np.ndarray
_CHUNK = 1024  # images per batch in the gathers below: bounds their temporaries


# ---------------------------------------------------------------- shared helpers


def image_generators(rng: np.random.Generator, n: int) -> list[np.random.Generator]:
    """One generator per image, seeded from `rng` in image order (one draw each), so image i's
    randomness does not depend on how many images follow it."""
    seeds = rng.integers(0, np.iinfo(np.int64).max, size=n)
    return [np.random.default_rng(int(s)) for s in seeds]


def reference_shape(h: int, w: int, scale: float) -> tuple[int, int]:
    """(h, w) in pixels of the 32×32 reference: 32×32 for square images of any size."""
    return round(h / scale), round(w / scale)


def resize(fields: Array, h: int, w: int) -> Array:
    """Fields `[N, C, h0, w0]` resized to `[N, C, h, w]` (Pillow bilinear, which averages when
    shrinking); unchanged when the size already matches."""
    if fields.shape[2:] == (h, w):
        return fields
    out = np.empty((*fields.shape[:2], h, w), np.float32)
    for i, j in np.ndindex(*fields.shape[:2]):
        image = Image.fromarray(np.ascontiguousarray(fields[i, j], np.float32))  # mode "F"
        out[i, j] = np.asarray(image.resize((w, h), Image.Resampling.BILINEAR))
    return out


def _fold(index: Array, n: int, mode: str) -> Array:
    """Integer indices brought inside 0..n-1: "mirror" (c b | a b c | b a, OpenCV's
    BORDER_REFLECT_101), "reflect" (b a | a b c | c b) or "nearest" (a a | a b c | c c)."""
    if mode == "nearest" or n == 1:
        return np.clip(index, 0, n - 1)
    shift = int(mode == "reflect")  # reflect repeats the edge pixel, mirror does not
    while True:  # one reflection per pass: displacements are rarely over a side long
        below, above = index < 0, index >= n
        if not (below.any() or above.any()):
            return index
        index = np.where(below, -index - shift, index)
        index = np.where(above, 2 * n - 2 + shift - index, index)


def sample_bilinear(x: Array, rows: Array, cols: Array, mode: str) -> Array:
    """Images `[N, C, H, W]` read bilinearly at (rows, cols) `[N, h, w]` (pixel centres at
    integers, as scipy's map_coordinates and OpenCV's warps) → `[N, C, h, w]`; `mode` as
    `_fold` says for points outside."""
    n, c, height, width = x.shape
    out = np.empty((n, c, *rows.shape[1:]), np.float32)
    for lo in range(0, n, _CHUNK):
        part = slice(lo, lo + _CHUNK)
        pixels = np.ascontiguousarray(x[part].transpose(0, 2, 3, 1)).reshape(-1, c)
        r0, c0 = np.floor(rows[part]), np.floor(cols[part])
        fr = (rows[part] - r0).astype(np.float32)[..., None]
        fc = (cols[part] - c0).astype(np.float32)[..., None]
        r0, c0 = r0.astype(np.intp), c0.astype(np.intp)
        base = (np.arange(len(r0)) * height)[:, None, None]
        top = (base + _fold(r0, height, mode)) * width
        bottom = (base + _fold(r0 + 1, height, mode)) * width
        left, right = _fold(c0, width, mode), _fold(c0 + 1, width, mode)

        def at(row: Array, col: Array, pixels: Array = pixels) -> Array:
            return np.take(pixels, row + col, axis=0)  # [n, h, w, C]

        acc = (1 - fr) * ((1 - fc) * at(top, left) + fc * at(top, right))
        acc += fr * ((1 - fc) * at(bottom, left) + fc * at(bottom, right))
        out[part] = acc.transpose(0, 3, 1, 2)
    return out


def clipped_zoom_matrix(n: int, factor: float) -> Array:
    """`[n, n]` linear map of CIFAR-10-C's `clipped_zoom` along an axis of n pixels: the central
    ceil(n / factor) pixels zoomed by `factor` with `scipy.ndimage.zoom(order=1)` (end pixels
    aligned, round(crop · factor) outputs), then the central n kept."""
    crop = int(np.ceil(n / factor))
    start = (n - crop) // 2
    size = round(crop * factor)  # scipy.ndimage.zoom's output length
    trim = (size - n) // 2
    step = (crop - 1) / (size - 1) if size > 1 else 0.0
    coords = np.arange(trim, trim + n) * step
    low = np.minimum(np.floor(coords).astype(int), crop - 1)
    frac = coords - low
    matrix = np.zeros((n, n))
    np.add.at(matrix, (np.arange(n), start + low), 1 - frac)
    np.add.at(matrix, (np.arange(n), start + np.minimum(low + 1, crop - 1)), frac)
    return matrix


def clipped_zoom(x: Array, factor: float) -> Array:
    """`clipped_zoom` of images `[N, C, H, W]` (each axis by `clipped_zoom_matrix`)."""
    rows = clipped_zoom_matrix(x.shape[2], factor).astype(np.float32)
    cols = clipped_zoom_matrix(x.shape[3], factor).astype(np.float32)
    return rows @ x @ cols.T


def motion_kernel(radius: float, sigma: float) -> Array:
    """ImageMagick's motion-blur weights (MotionBlurImage): one-sided Gaussian taps
    exp(-i² / 2σ²), i = 0 .. 2·ceil(radius), normalised."""
    i = np.arange(int(2 * np.ceil(radius) + 1), dtype=np.float64)
    taps = np.exp(-(i**2) / (2 * sigma**2))
    return taps / taps.sum()


def line_blur(x: Array, radius: float, sigma: float, angles: Array) -> Array:
    """ImageMagick's motion blur of each image `[N, C, H, W]` along its own angle (degrees).

    Tap i reads the pixel at (column + round(i·cos a), row + round(i·sin a)) (rounding half
    down, `ceil(v - 0.5)`, as ImageMagick), edges replicated (its default virtual pixels).
    """
    taps = motion_kernel(radius, sigma)
    steps = np.arange(len(taps))
    a = np.deg2rad(np.asarray(angles, np.float64))
    px, py = len(taps) * np.sin(a), len(taps) * np.cos(a)
    norm = np.hypot(px, py)[:, None]
    dx = np.ceil(steps * py[:, None] / norm - 0.5).astype(np.intp)  # [N, taps]
    dy = np.ceil(steps * px[:, None] / norm - 0.5).astype(np.intp)
    n, c, h, w = x.shape
    out = np.empty_like(x)
    for lo in range(0, n, _CHUNK):
        part = np.ascontiguousarray(x[lo : lo + _CHUNK].transpose(0, 2, 3, 1))  # [n, H, W, C]
        pixels = part.reshape(-1, c)
        base = (np.arange(len(part)) * h)[:, None]
        acc = np.zeros_like(part)
        for j, weight in enumerate(taps):
            rows = base + np.clip(np.arange(h)[None, :] + dy[lo : lo + _CHUNK, j, None], 0, h - 1)
            cols = np.clip(np.arange(w)[None, :] + dx[lo : lo + _CHUNK, j, None], 0, w - 1)
            index = rows[:, :, None] * w + cols[:, None, :]  # [n, H, W] into the flat pixels
            acc += np.float32(weight) * np.take(pixels, index, axis=0)
        out[lo : lo + _CHUNK] = acc.transpose(0, 3, 1, 2)
    return out


def _gaussian(x: Array, sigma: float) -> Array:
    """skimage's `gaussian` per channel: 2-D, border `nearest`, truncated at 4σ."""
    return ndimage.gaussian_filter(x, sigma=(0, 0, sigma, sigma), mode="nearest")


# ---------------------------------------------------------------- corruptions


def glass_blur(
    x: Array, rng: np.random.Generator, scale: float, *, sigma: float, delta: int, iterations: int
) -> Array:
    # Blur, then `iterations` scans from the bottom-right pixel to (delta + 1, delta + 1), each
    # pixel taking the value of the one (dy, dx) away, dy, dx uniform in [-delta, delta): the
    # reference's tuple "swap" of numpy views copies (numpy/numpy#14428), so that is what
    # CIFAR-10-C holds. The scan runs in the reference order, one step for all images at once.
    sigma, delta = sigma * scale, max(1, round(delta * scale))
    n, c, h, w = x.shape
    rows, cols = range(h - delta, delta, -1), range(w - delta, delta, -1)
    shape = (iterations, len(rows), len(cols), 2)  # per pixel (dx, dy), in the reference order
    shifts = np.stack([g.integers(-delta, delta, size=shape) for g in image_generators(rng, n)])
    # Flat pixel indices (image-major): each step's destination pixel and its source's offset.
    base = np.arange(n) * (h * w)
    dest = (np.asarray(rows)[:, None] * w + np.asarray(cols)[None, :]).reshape(-1)
    moves = shifts[..., 1] * w + shifts[..., 0]  # [N, iterations, rows, cols]
    moves = np.ascontiguousarray(moves.reshape(n, iterations, -1).transpose(1, 2, 0))
    pixels = np.ascontiguousarray(_gaussian(x, sigma).transpose(0, 2, 3, 1)).reshape(-1, c)
    for it in range(iterations):
        for k, d in enumerate(dest):
            pixels[base + d] = pixels[base + d + moves[it, k]]
    out = pixels.reshape(n, h, w, c).transpose(0, 3, 1, 2)
    return _gaussian(out, sigma)


def motion_blur(
    x: Array, rng: np.random.Generator, scale: float, *, radius: float, sigma: float
) -> Array:
    angles = [g.uniform(-45, 45) for g in image_generators(rng, x.shape[0])]
    return line_blur(x, radius * scale, sigma * scale, np.asarray(angles))


def zoom_blur(x: Array, rng: np.random.Generator, scale: float, *, end: float) -> Array:
    # The mean of the image and its clipped zooms by 1, 1.01, ... (the reference's
    # np.arange(1, end, 0.01), floating-point end effects included): factors are relative.
    factors = np.arange(1, end, 0.01)
    total = x.copy()
    for factor in factors:
        total += clipped_zoom(x, factor)
    return total / np.float32(len(factors) + 1)


def elastic_transform(
    x: Array, rng: np.random.Generator, scale: float, *, alpha: float, sigma: float, shift: float
) -> Array:
    # The parameters are fractions of the image side (the reference's IMSIZE): a random affine
    # warp moving three points around the centre (OpenCV getAffineTransform + warpAffine,
    # bilinear, BORDER_REFLECT_101), then a displacement field: uniform noise smoothed by a
    # Gaussian (border reflect, truncated at 3σ) times alpha, read bilinearly (border reflect).
    n, _, h, w = x.shape
    side = min(h, w)
    alpha, sigma, shift = (p * side for p in (alpha, sigma, shift))
    # Points are (x, y); `half` at least 1 px, so tiny images still get three distinct points.
    centre, half = np.array([w // 2, h // 2], np.float64), max(1, side // 3)
    src = np.array([centre + half, [centre[0] + half, centre[1] - half], centre - half])
    moves, noise = [], []
    for g in image_generators(rng, n):  # the reference's order: the affine, then dx, then dy
        moves.append(g.uniform(-shift, shift, size=(3, 2)))
        noise.append(g.uniform(-1, 1, size=(2, h, w)))
    dst = src[None] + np.asarray(moves)  # [N, 3, 2]
    # The affine map M (dst = M·src) read backwards: each output pixel samples M⁻¹(pixel).
    homogeneous = np.concatenate([src, np.ones((3, 1))], axis=1)  # [3, 3]
    m = np.linalg.solve(homogeneous, dst).transpose(0, 2, 1)  # [N, 2, 3]
    inverse = np.linalg.inv(m[:, :, :2])  # [N, 2, 2]
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64)
    offset = np.stack([xs, ys])[None] - m[:, :, 2, None, None]  # [N, 2, H, W]
    source = np.einsum("nij,njhw->nihw", inverse, offset)
    warped = sample_bilinear(x, source[:, 1], source[:, 0], "mirror")
    if alpha == 0.0:
        return warped
    field = ndimage.gaussian_filter(
        np.asarray(noise), sigma=(0, 0, sigma, sigma), mode="reflect", truncate=3.0
    )
    dx, dy = alpha * field[:, 0], alpha * field[:, 1]
    return sample_bilinear(warped, ys + dy, xs + dx, "reflect")
