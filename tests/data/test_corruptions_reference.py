"""Glass, motion and zoom blur, elastic, snow, frost, fog and spatter against literal ports of
CIFAR-10-C's reference code (`hendrycks/robustness`, `ImageNet-C/create_c/make_cifar_c.py`):
image by image, pixel by pixel, with scipy's zoom / map_coordinates and an ImageMagick and
OpenCV loop port where the reference calls those, `np.random` replaced by each image's
generator. Also: every size and channel count, and frost without its photographs."""

from __future__ import annotations

import importlib.resources
import io
import sys
import zlib

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import ndimage

from peg.data import _corruption_blur as blur
from peg.data import _corruption_weather as weather
from peg.data import corruptions as cc
from peg.data._corruption_records import BY_NAME

NEW = (
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "spatter",
    "elastic_transform",
)
GREY = np.array([0.299, 0.587, 0.114])  # cv2.COLOR_RGB2GRAY


def _images(n: int, channels: int, size: int, seed: int = 0) -> np.ndarray:
    """`[n, channels, size, size]` float32: smooth colour ramps and a few flat rectangles."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    out = np.empty((n, channels, size, size), np.float32)
    for i in range(n):
        for c in range(channels):
            a, b = rng.uniform(-0.4, 0.4, 2)
            out[i, c] = 0.5 + a * xx + b * yy
        for _ in range(3):
            r, q = rng.integers(0, size - 6, 2)
            out[i, :, r : r + 6, q : q + 8] = rng.uniform(0.05, 0.95, (channels, 1, 1))
    return np.clip(out, 0, 1)


def _generators(name: str, severity: int, n: int, seed: int = 0) -> list[np.random.Generator]:
    """The per-image generators `corrupt(..., name, severity, seed)` draws from."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode()), severity])
    return blur.image_generators(rng, n)


def _check(name: str, severity: int, x: np.ndarray, port, atol: float = 1e-5) -> None:
    """corrupt(x) against `port(image [H, W, C] float64, parameter, generator)` per image."""
    got = cc.corrupt(torch.from_numpy(x), name, severity).numpy()
    values = tuple(BY_NAME[name].at(severity).values())  # in the record's order
    param = values[0] if len(values) == 1 else values
    gens = _generators(name, severity, len(x))
    want = [
        port(img.transpose(1, 2, 0).astype(np.float64), param, g)
        for img, g in zip(x, gens, strict=True)
    ]
    want = np.clip(np.asarray(want), 0, 1).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, want, atol=atol, rtol=0)


# ---------------------------------------------------------------- literal ports (32×32, RGB)


def ref_gaussian(img, sigma):
    """skimage.filters.gaussian(img, sigma, multichannel=True)."""
    return np.stack(
        [ndimage.gaussian_filter(img[..., k], sigma, mode="nearest") for k in range(3)], -1
    )


def ref_glass(img, c, g):
    img = ref_gaussian(img, c[0])
    for _ in range(c[2]):
        for h in range(32 - c[1], c[1], -1):
            for w in range(32 - c[1], c[1], -1):
                dx, dy = g.integers(-c[1], c[1], size=(2,))
                h_prime, w_prime = h + dy, w + dx
                img[h, w], img[h_prime, w_prime] = img[h_prime, w_prime], img[h, w]  # as written
    return ref_gaussian(img, c[0])


def ref_clipped_zoom(img, zoom_factor):
    h = img.shape[0]
    ch = int(np.ceil(h / zoom_factor))
    top = (h - ch) // 2
    img = ndimage.zoom(img[top : top + ch, top : top + ch], (zoom_factor, zoom_factor, 1), order=1)
    trim_top = (img.shape[0] - h) // 2
    return img[trim_top : trim_top + h, trim_top : trim_top + h]


def ref_zoom_blur(img, end, g):
    factors = np.arange(1, end, 0.01)
    out = np.zeros_like(img)
    for zoom_factor in factors:
        out += ref_clipped_zoom(img, zoom_factor)
    return (img + out) / (len(factors) + 1)


def ref_magick_motion_blur(img, radius, sigma, angle):
    """ImageMagick's MotionBlurImage, its loops as written, edge virtual pixels."""
    width = int(2.0 * np.ceil(radius) + 1.0)  # GetOptimalKernelWidth1D
    kernel = np.array([np.exp(-(i * i) / (2.0 * sigma * sigma)) for i in range(width)])
    kernel /= kernel.sum()
    px, py = width * np.sin(np.deg2rad(angle)), width * np.cos(np.deg2rad(angle))
    offsets = [
        (
            int(np.ceil(i * py / np.hypot(px, py) - 0.5)),
            int(np.ceil(i * px / np.hypot(px, py) - 0.5)),
        )
        for i in range(width)
    ]
    rows, cols = img.shape[:2]
    out = np.zeros_like(img)
    for y in range(rows):
        for x in range(cols):
            for k, (ox, oy) in zip(kernel, offsets, strict=True):
                out[y, x] += k * img[min(max(y + oy, 0), rows - 1), min(max(x + ox, 0), cols - 1)]
    return out


def ref_motion_blur(img, c, g):
    return ref_magick_motion_blur(img, c[0], c[1], g.uniform(-45, 45))


def ref_plasma_fractal(g, mapsize=32, wibbledecay=3):
    maparray = np.empty((mapsize, mapsize), dtype=np.float64)
    maparray[0, 0] = 0
    stepsize = mapsize
    wibble = 100

    def wibbledmean(array):
        return array / 4 + wibble * g.uniform(-wibble, wibble, array.shape)

    def fillsquares():
        cornerref = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        squareaccum = cornerref + np.roll(cornerref, shift=-1, axis=0)
        squareaccum += np.roll(squareaccum, shift=-1, axis=1)
        maparray[stepsize // 2 : mapsize : stepsize, stepsize // 2 : mapsize : stepsize] = (
            wibbledmean(squareaccum)
        )

    def filldiamonds():
        mapsize = maparray.shape[0]
        drgrid = maparray[stepsize // 2 : mapsize : stepsize, stepsize // 2 : mapsize : stepsize]
        ulgrid = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        ltsum = drgrid + np.roll(drgrid, 1, axis=0) + ulgrid + np.roll(ulgrid, -1, axis=1)
        maparray[0:mapsize:stepsize, stepsize // 2 : mapsize : stepsize] = wibbledmean(ltsum)
        ttsum = drgrid + np.roll(drgrid, 1, axis=1) + ulgrid + np.roll(ulgrid, -1, axis=0)
        maparray[stepsize // 2 : mapsize : stepsize, 0:mapsize:stepsize] = wibbledmean(ttsum)

    while stepsize >= 2:
        fillsquares()
        filldiamonds()
        stepsize //= 2
        wibble /= wibbledecay
    maparray -= maparray.min()
    return maparray / maparray.max()


def ref_fog(img, c, g):
    max_val = img.max()
    img = img + c[0] * ref_plasma_fractal(g, wibbledecay=c[1])[:32, :32][..., np.newaxis]
    return img * max_val / (max_val + c[0])


def ref_frost_photos() -> list[np.ndarray]:
    """cv2.resize(fx=fy=0.2) of each photograph: pixel centres (i + .5) · 5 - .5 = 5i + 2."""
    folder = importlib.resources.files("torch_uncertainty_assets") / "frost"
    photos = []
    for i in range(1, 6):
        with Image.open(io.BytesIO((folder / f"frost{i}.jpg").read_bytes())) as image:
            photos.append(np.asarray(image.convert("RGB"), np.float64)[2::5, 2::5] / 255)
    return photos


def ref_frost(img, c, g):
    frost = ref_frost_photos()[g.integers(5)]
    x_start, y_start = g.integers(0, frost.shape[0] - 32), g.integers(0, frost.shape[1] - 32)
    return c[0] * img + c[1] * frost[x_start : x_start + 32, y_start : y_start + 32]


def ref_snow(img, c, g):
    snow_layer = g.normal(size=img.shape[:2], loc=c[0], scale=c[1])
    snow_layer = ref_clipped_zoom(snow_layer[..., np.newaxis], c[2])
    snow_layer[snow_layer < c[3]] = 0
    snow_layer = np.clip(snow_layer, 0, 1)  # (the reference's 8-bit PNG: not kept)
    snow_layer = ref_magick_motion_blur(snow_layer, c[4], c[5], g.uniform(-135, -45))
    img = c[6] * img + (1 - c[6]) * np.maximum(img, (img @ GREY)[..., None] * 1.5 + 0.5)
    return img + snow_layer + np.rot90(snow_layer, k=2)


def ref_elastic(img, c, g):
    c = [32 * p for p in c]
    shape_size = img.shape[:2]
    center_square = np.float32(shape_size) // 2
    square_size = min(shape_size) // 3
    pts1 = np.float32(
        [
            center_square + square_size,
            [center_square[0] + square_size, center_square[1] - square_size],
            center_square - square_size,
        ]
    )
    pts2 = pts1 + g.uniform(-c[2], c[2], size=pts1.shape).astype(np.float32)
    # cv2.getAffineTransform(pts1, pts2), then cv2.warpAffine(BORDER_REFLECT_101): each output
    # pixel p reads the input at M⁻¹(p), bilinearly.
    m = np.linalg.lstsq(np.c_[pts1, np.ones(3)], pts2, rcond=None)[0].T
    ys, xs = np.mgrid[0:32, 0:32].astype(np.float64)
    sx, sy = np.linalg.inv(m[:, :2]) @ np.stack([xs.ravel() - m[0, 2], ys.ravel() - m[1, 2]])
    img = np.stack(
        [ndimage.map_coordinates(img[..., k], [sy, sx], order=1, mode="mirror") for k in range(3)],
        -1,
    ).reshape(img.shape)
    dx = ndimage.gaussian_filter(g.uniform(-1, 1, size=(32, 32)), c[1], mode="reflect", truncate=3)
    dy = ndimage.gaussian_filter(g.uniform(-1, 1, size=(32, 32)), c[1], mode="reflect", truncate=3)
    coords = [ys + dy * c[0], xs + dx * c[0]]
    return np.stack(
        [ndimage.map_coordinates(img[..., k], coords, order=1, mode="reflect") for k in range(3)],
        -1,
    )


def ref_canny(img: np.ndarray, low: float, high: float) -> np.ndarray:
    """OpenCV's Canny (aperture 3, L1 norm) as its C++ loops do it, one 8-bit image."""
    p = np.pad(img.astype(np.int64), 1, mode="edge")
    dx = (p[:-2, 2:] + 2 * p[1:-1, 2:] + p[2:, 2:]) - (p[:-2, :-2] + 2 * p[1:-1, :-2] + p[2:, :-2])
    dy = (p[2:, :-2] + 2 * p[2:, 1:-1] + p[2:, 2:]) - (p[:-2, :-2] + 2 * p[:-2, 1:-1] + p[:-2, 2:])
    mag = np.abs(dx) + np.abs(dy)
    padded = np.pad(mag, 1)
    tg22 = int(0.4142135623730950488016887242097 * (1 << 15) + 0.5)
    state = np.zeros(img.shape, np.int64)  # 1: weak, 2: strong
    for i, j in np.ndindex(*img.shape):
        m = mag[i, j]
        if m <= low:
            continue
        xs, ys = int(dx[i, j]), int(dy[i, j])
        x, y = abs(xs), abs(ys) << 15
        tg22x = x * tg22
        if y < tg22x:
            peak = m > padded[i + 1, j] and m >= padded[i + 1, j + 2]
        elif y > tg22x + (x << 16):
            peak = m > padded[i, j + 1] and m >= padded[i + 2, j + 1]
        else:
            s = -1 if (xs ^ ys) < 0 else 1
            peak = m > padded[i, j + 1 - s] and m > padded[i + 2, j + 1 + s]
        if peak:
            state[i, j] = 2 if m > high else 1
    edges = state == 2
    stack = list(zip(*np.nonzero(edges), strict=True))
    while stack:
        i, j = stack.pop()
        for a in range(max(i - 1, 0), min(i + 2, img.shape[0])):
            for b in range(max(j - 1, 0), min(j + 2, img.shape[1])):
                if state[a, b] == 1 and not edges[a, b]:
                    edges[a, b] = True
                    stack.append((a, b))
    return edges


def ref_equalize_hist(img: np.ndarray) -> np.ndarray:
    """OpenCV's equalizeHist as its C++ loop does it, one 8-bit image."""
    hist = np.bincount(img.ravel().astype(np.int64), minlength=256)
    i = int(np.flatnonzero(hist)[0])
    if hist[i] == img.size:
        return img.copy()
    scale = 255.0 / (img.size - hist[i])
    lut = np.zeros(256)
    total = 0
    for k in range(i + 1, 256):
        total += hist[k]
        lut[k] = min(max(np.rint(total * scale), 0), 255)
    return lut[img.astype(np.int64)]


def ref_spatter(img, c, g):
    liquid_layer = g.normal(size=img.shape[:2], loc=c[0], scale=c[1])
    liquid_layer = ndimage.gaussian_filter(liquid_layer, c[2], mode="nearest")
    liquid_layer[liquid_layer < c[3]] = 0
    if c[5] == 0:
        liquid_layer = np.floor(np.clip(liquid_layer, 0, 1) * 255)
        edges = ref_canny(liquid_layer, 50, 150)
        dist = ndimage.distance_transform_edt(~edges) if edges.any() else np.full(edges.shape, 20.0)
        dist = np.floor(ndimage.uniform_filter(np.minimum(dist, 20), 3, mode="mirror"))
        dist = ref_equalize_hist(dist)
        ker = np.array([[-2, -1, 0], [-1, 1, 1], [0, 1, 2]])
        dist = np.clip(ndimage.correlate(dist, ker, mode="mirror"), 0, 255)
        dist = np.rint(ndimage.uniform_filter(dist, 3, mode="mirror"))
        m = liquid_layer * dist
        m = m / m.max() * c[4]
        return img + m[..., None] * np.array([175, 238, 238]) / 255.0
    m = np.where(liquid_layer > c[3], 1, 0)
    m = ndimage.gaussian_filter(m.astype(np.float32), c[4], mode="nearest")
    m[m < 0.8] = 0
    return img * (1 - m[..., None]) + np.array([63, 42, 20]) / 255.0 * m[..., None]


# ---------------------------------------------------------------- the checks


@pytest.mark.parametrize("severity", [1, 4])
def test_glass_blur_is_the_reference_loop(severity) -> None:
    _check("glass_blur", severity, _images(3, 3, 32), ref_glass)


def test_glass_blur_scan_copies_from_up_and_left_only() -> None:
    """δ = 1: offsets in {-1, 0}², so each pass reads pixels not yet written: it is one gather
    from the previous pass, the bottom-right 30×30 only (rows and columns 0, 1 never written)."""
    x = _images(2, 1, 32)
    gens = _generators("glass_blur", 2, 2)
    got = cc.corrupt(torch.from_numpy(x), "glass_blur", 2).numpy()
    for img, out, g in zip(x, got, gens, strict=True):
        shifts = g.integers(-1, 1, size=(30, 30, 2))  # one pass, rows/cols 31 .. 2
        blurred = ndimage.gaussian_filter(img[0].astype(np.float64), 0.25, mode="nearest")
        moved = blurred.copy()
        rows, cols = np.meshgrid(np.arange(31, 1, -1), np.arange(31, 1, -1), indexing="ij")
        moved[rows, cols] = blurred[rows + shifts[..., 1], cols + shifts[..., 0]]
        want = ndimage.gaussian_filter(moved, 0.25, mode="nearest")
        np.testing.assert_allclose(out[0], want, atol=1e-5)


@pytest.mark.parametrize("severity", [1, 5])
def test_zoom_blur_matches_scipy_zoom(severity) -> None:
    _check("zoom_blur", severity, _images(2, 3, 32), ref_zoom_blur)


def test_clipped_zoom_matrix_matches_scipy_zoom_at_28_pixels() -> None:
    img = _images(1, 3, 28)[0].transpose(1, 2, 0).astype(np.float64)
    for factor in (1.03, 1.17, 1.75, 2.25):
        got = blur.clipped_zoom(img.transpose(2, 0, 1)[None].astype(np.float32), factor)
        np.testing.assert_allclose(
            got[0].transpose(1, 2, 0), ref_clipped_zoom(img, factor), atol=1e-5
        )


@pytest.mark.parametrize("severity", [1, 4])
def test_motion_blur_is_imagemagicks(severity) -> None:
    _check("motion_blur", severity, _images(2, 3, 32), ref_motion_blur)


def test_fog_fractal_is_the_reference_diamond_square() -> None:
    _check("fog", 4, _images(2, 3, 32), ref_fog)


def test_frost_crops_the_shrunk_photographs() -> None:
    _check("frost", 5, _images(3, 3, 32), ref_frost)


def test_snow_is_the_reference() -> None:
    _check("snow", 3, _images(2, 3, 32), ref_snow)


@pytest.mark.parametrize("severity", [1, 3])
def test_elastic_transform_matches_map_coordinates(severity) -> None:
    _check("elastic_transform", severity, _images(2, 3, 32), ref_elastic, atol=1e-4)


@pytest.mark.parametrize("severity", [2, 4])
def test_spatter_water_and_mud(severity) -> None:
    _check("spatter", severity, _images(2, 3, 32), ref_spatter, atol=1e-4)


def test_canny_and_equalize_hist_match_opencvs_loops() -> None:
    rng = np.random.default_rng(3)
    liquid = ndimage.gaussian_filter(rng.normal(0.65, 0.3, (4, 32, 32)), (0, 1, 1), mode="nearest")
    liquid[liquid < 0.69] = 0
    levels = np.floor(np.clip(liquid, 0, 1) * 255)
    levels[3] = rng.integers(0, 256, (32, 32))  # noise: many weak edges, hysteresis matters
    edges = weather.canny(levels, 50, 150)
    assert edges[:3].any() and 0 < edges[3].mean() < 1
    for i in range(4):
        assert np.array_equal(edges[i], ref_canny(levels[i], 50, 150)), i
    values = np.floor(rng.uniform(3, 21, (3, 16, 16)))
    values[2] = 7.0  # one value: left as it is
    got = weather.equalize_hist(values)
    for i in range(3):
        assert np.array_equal(got[i], ref_equalize_hist(values[i])), i


@pytest.mark.parametrize("size", [28, 32])
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("name", NEW)
def test_every_size_and_channel_count(name, channels, size) -> None:
    X = torch.from_numpy(_images(2, channels, size, seed=size + channels))
    for severity in cc.SEVERITIES:
        Y = cc.corrupt(X, name, severity, seed=4)
        assert Y.shape == X.shape and Y.dtype == X.dtype
        assert float(Y.min()) >= 0.0 and float(Y.max()) <= 1.0
        assert float((Y - X).abs().mean()) > 0
        assert torch.equal(Y, cc.corrupt(X, name, severity, seed=4))


@pytest.mark.parametrize("name", ["frost", "spatter"])
def test_grey_images_are_the_luma_of_their_rgb_copy(name) -> None:
    grey = _images(3, 1, 28)
    rgb = np.repeat(grey, 3, axis=1)
    want = np.clip(cc.corrupt(torch.from_numpy(rgb), name, 4).numpy(), 0, 1)
    want = np.tensordot(GREY.astype(np.float32), want, axes=([0], [1]))[:, None]
    got = cc.corrupt(torch.from_numpy(grey), name, 4).numpy()
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_weather_layers_are_made_at_32_pixels_and_resized() -> None:
    """A 28×28 image's fog is the 32×32 fractal resized: its values span the full fractal."""
    x = torch.zeros(2, 1, 28, 28)
    x[:, :, 0, 0] = 1.0  # max = 1: fog = (0 + c·fractal) / (1 + c)
    fog = cc.corrupt(x, "fog", 5).numpy()[:, 0]
    rng = np.random.default_rng([0, zlib.crc32(b"fog"), 5])
    noise = np.stack([g.random(1023) for g in blur.image_generators(rng, 2)])
    fractal = weather.plasma_fractal(noise, 32, 1.75)[:, None].astype(np.float32)
    want = blur.resize(fractal, 28, 28)[:, 0] * 1.5 / 2.5
    np.testing.assert_allclose(fog[:, 1:, 1:], want[:, 1:, 1:], atol=1e-5)


@pytest.fixture
def no_frost_cache():
    weather.frost_photos.cache_clear()
    yield
    weather.frost_photos.cache_clear()


def test_frost_without_its_package_says_how_to_install_it(monkeypatch, no_frost_cache) -> None:
    monkeypatch.setitem(sys.modules, "torch_uncertainty_assets", None)  # import fails
    X = torch.rand(2, 3, 32, 32)
    pattern = r"^name: 'frost' needs .*torch-uncertainty-assets.*pip install torch-uncertainty"
    with pytest.raises(ModuleNotFoundError, match=pattern):
        cc.corrupt(X, "frost", 1)
    with pytest.raises(ModuleNotFoundError, match=pattern):  # at the call, before any set
        cc.shifted_sets(X, names=["contrast", "frost"])
    assert cc.corrupt(X, "fog", 1).shape == X.shape  # the others do not need it


def test_frost_refuses_other_photographs(monkeypatch, no_frost_cache) -> None:
    monkeypatch.setattr(weather, "_FROST_SHA256", ("0" * 64,) * 5)
    with pytest.raises(RuntimeError, match=r"frost1\.jpg differs .*==0\.5\.2"):
        cc.corrupt(torch.rand(1, 3, 32, 32), "frost", 1)


@pytest.mark.parametrize("shape", [(2, 3, 1, 1), (2, 1, 2, 2), (2, 3, 5, 7), (2, 1, 40, 24)])
def test_tiny_and_non_square_images(shape) -> None:
    X = torch.rand(*shape, generator=torch.Generator().manual_seed(0))
    for name in cc.applicable(shape[1]):
        Y = cc.corrupt(X, name, 5, seed=1)
        assert Y.shape == X.shape and torch.isfinite(Y).all(), name
        assert float(Y.min()) >= 0.0 and float(Y.max()) <= 1.0, name
