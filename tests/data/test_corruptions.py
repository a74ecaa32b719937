"""CIFAR-10-C-style corruptions and rotations (peg.data.corruptions)."""

from __future__ import annotations

import colorsys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import ndimage

from peg.data import _corruption_functions as functions
from peg.data import corruptions as cc
from peg.data._corruption_records import BY_NAME, table

NOISES = ("gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise")
RANDOM = (
    *NOISES,
    *("glass_blur", "motion_blur", "snow", "frost", "fog", "spatter", "elastic_transform"),
)
DETERMINISTIC = tuple(n for n in cc.CORRUPTIONS if n not in RANDOM)
CONSECUTIVE = ((1, 2), (2, 3), (3, 4), (4, 5))
# Severity pairs (a, b) whose mean change |corrupted - clean| must grow from a to b: those where
# the reference parameters at b dominate those at a. The others are left out on purpose (see
# the docstring of peg.data.corruptions):
GROWS: dict[str, tuple[tuple[int, int], ...]] = {name: CONSECUTIVE for name in cc.CORRUPTIONS}
GROWS |= {
    # 1-2 desaturate (2 more), 3-5 oversaturate (increasingly): the reference design.
    "saturate": ((1, 2), (3, 4), (4, 5)),
    # 3 and 4 are one kernel (σ = 2; radius 6 vs 8 adds taps of weight < e^-18).
    "motion_blur": ((1, 2), (2, 3), (3, 5), (4, 5)),
    # A second pass of pixel copies; σ <= .4 barely blurs, and a blur can bring the shuffled
    # image closer to the clean one, so 1-2-3 and 4-5 (σ up, passes equal) are not ordered.
    "glass_blur": ((1, 4), (2, 4), (1, 5), (2, 5), (3, 5)),
    # c0 = 1 in both: more frost only. Later c0 falls as c1 rises: |c1·f - (1 - c0)·x| can shrink.
    "frost": ((1, 2),),
    # 1 -> 2: lower threshold, longer streaks, less of the image; later parameters cross.
    "snow": ((1, 2),),
    "spatter": (),  # water (1-3), then mud (4-5); blur σ and threshold not ordered
    "elastic_transform": (),  # the affine shift shrinks while the elastic part grows
}
REQUIRED = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "box_blur",
    "contrast",
    "brightness",
    "saturate",
    "pixelate",
    "jpeg_compression",
)


def images(n: int, channels: int, size: int, seed: int = 0) -> torch.Tensor:
    """`[n, channels, size, size]` float32 in [0, 1]: smooth waves plus sharp-edged rectangles
    (so blurs and pixelation change them), channels differently tinted (so saturation does)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    out = np.empty((n, channels, size, size), np.float32)
    for i in range(n):
        base = np.zeros((size, size))
        for _ in range(3):
            f, a, p = rng.uniform(1, 4), rng.uniform(0, np.pi), rng.uniform(0, 2 * np.pi)
            base += np.cos(2 * np.pi * f * (np.cos(a) * xx + np.sin(a) * yy) + p)
        base = 0.5 + 0.12 * base
        for _ in range(3):
            r, q = rng.integers(0, size - 6, 2)
            h, w = rng.integers(4, size // 2, 2)
            base[r : r + h, q : q + w] = rng.uniform(0.1, 0.9)
        for j in range(channels):
            out[i, j] = base * rng.uniform(0.6, 1.0) + rng.uniform(0, 0.2) * (xx if j % 2 else yy)
    return torch.from_numpy(np.clip(out, 0, 1))


@pytest.fixture(scope="module")
def rgb() -> torch.Tensor:
    return images(16, 3, 32)


@pytest.fixture(scope="module")
def grey() -> torch.Tensor:
    return images(16, 1, 28, seed=1)


def test_names_and_parameter_table() -> None:
    assert set(REQUIRED) <= set(cc.CORRUPTIONS)
    assert len(set(cc.CORRUPTIONS)) == len(cc.CORRUPTIONS)
    assert tuple(BY_NAME) == cc.CORRUPTIONS
    assert all(len(v) == 5 for r in BY_NAME.values() for v in r.parameters.values())
    assert cc.applicable(3) == cc.CORRUPTIONS
    assert cc.applicable(1) == tuple(n for n in cc.CORRUPTIONS if n != "saturate")
    assert cc.ROTATION_ANGLES == (0, 15, 30, 45, 60, 75, 90, 105, 120, 135, 150, 165, 180)


def _changes(X: torch.Tensor, name: str) -> list[float]:
    """Mean |corrupted - clean| per severity, checking shape, dtype and range on the way."""
    out = []
    for severity in cc.SEVERITIES:
        Y = cc.corrupt(X, name, severity, seed=0)
        assert Y.shape == X.shape and Y.dtype == torch.float32
        assert float(Y.min()) >= 0.0 and float(Y.max()) <= 1.0
        out.append(float((Y - X).abs().mean()))
    return out


@pytest.mark.parametrize("kind", ["rgb", "grey"])
@pytest.mark.parametrize("name", cc.CORRUPTIONS)
def test_every_severity_keeps_format_and_change_grows(name: str, kind: str, request) -> None:
    X = request.getfixturevalue(kind)
    if name not in cc.applicable(X.shape[1]):
        pytest.skip(f"{name} does not apply to grey images (raises, tested below)")
    change = _changes(X, name)
    assert min(change) > 0, change
    for a, b in GROWS[name]:
        assert change[b - 1] > change[a - 1], (a, b, change)


def test_saturate_on_grey_images_is_an_error(grey) -> None:
    with pytest.raises(ValueError, match=r"^X: saturate needs RGB"):
        cc.corrupt(grey, "saturate", 1)


@pytest.mark.parametrize("name", RANDOM)
def test_random_corruptions_are_seeded(rgb, name: str) -> None:
    a = cc.corrupt(rgb, name, 3, seed=1)
    assert torch.equal(a, cc.corrupt(rgb, name, 3, seed=1))
    b = cc.corrupt(rgb, name, 3, seed=2)
    assert all(not torch.equal(a[i], b[i]) for i in range(len(a)))  # every image redrawn
    # Each image's randomness depends on its position only, not on how many follow it.
    assert torch.equal(cc.corrupt(rgb[:5], name, 3, seed=1), a[:5])


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_deterministic_corruptions_ignore_the_seed(grey, name: str) -> None:
    if name not in cc.applicable(1):
        pytest.skip(f"{name} does not apply to grey images")
    assert torch.equal(cc.corrupt(grey, name, 4, seed=0), cc.corrupt(grey, name, 4, seed=9))


def test_defocus_kernels_match_the_reference_at_32_and_scale_continuously() -> None:
    plus = functions.reference_disk(1.0, 0.2)  # radius 1: the 5-pixel cross, barely anti-aliased
    assert plus.shape == (5, 5) and plus[2, 2] == pytest.approx(0.2, abs=1e-6)
    box = functions.reference_disk(1.5, 0.1)  # radius 1.5: the 3×3 square
    assert box[1:4, 1:4] == pytest.approx(np.full((3, 3), 1 / 9), abs=1e-6)
    assert np.array_equal(functions.resample_kernel(plus, 1.0), plus)
    small = functions.resample_kernel(plus, 28 / 32)
    assert small.sum() == pytest.approx(1.0)
    assert plus[2, 2] < small[2, 2] < 1.0  # smaller radius in pixels: less spread, not none


def test_box_blur_of_odd_width_is_uniform_filter(rgb) -> None:
    X = rgb.numpy()
    expected = ndimage.uniform_filter(X, size=(1, 1, 3, 3), mode="reflect")  # severity 3: w = 3
    np.testing.assert_allclose(cc.corrupt(rgb, "box_blur", 3).numpy(), expected, atol=1e-6)


def test_contrast_and_brightness_values(grey, rgb) -> None:
    X = grey.numpy()
    mean = X.mean(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(
        cc.corrupt(grey, "contrast", 2).numpy(), np.clip((X - mean) * 0.5 + mean, 0, 1), atol=1e-6
    )
    np.testing.assert_allclose(
        cc.corrupt(grey, "brightness", 5).numpy(), np.clip(X + 0.3, 0, 1), atol=1e-6
    )


def _hsv_reference(pixels: np.ndarray, channel: int, a: float, b: float) -> np.ndarray:
    """CIFAR-10-C's HSV edit, pixel by pixel with colorsys: hsv[channel] = clip(a·v + b)."""
    out = []
    for rgb_pixel in pixels:
        hsv = list(colorsys.rgb_to_hsv(*rgb_pixel))
        hsv[channel] = min(max(hsv[channel] * a + b, 0.0), 1.0)
        out.append(colorsys.hsv_to_rgb(*hsv))
    return np.asarray(out)


@pytest.mark.parametrize(
    ("name", "severity", "channel", "a", "b"),
    [
        ("brightness", 4, 2, 1.0, 0.2),
        ("saturate", 2, 1, 0.1, 0.0),
        ("saturate", 5, 1, 2.5, 0.2),
    ],
)
def test_hsv_corruptions_match_colorsys(name, severity, channel, a, b) -> None:
    rng = np.random.default_rng(0)
    pixels = rng.random((64, 3)).astype(np.float32)
    pixels[:4] = [[0, 0, 0], [0.5, 0.5, 0.5], [1, 1, 1], [0.2, 0.2, 0.7]]  # greys, a tie
    X = torch.from_numpy(pixels.T.reshape(1, 3, 8, 8).copy())
    got = cc.corrupt(X, name, severity).numpy().reshape(3, 64).T
    np.testing.assert_allclose(got, _hsv_reference(pixels, channel, a, b), atol=1e-5)


def test_pixelate_and_jpeg_sizes_scale(grey) -> None:
    Y = cc.corrupt(grey, "jpeg_compression", 5).numpy()
    np.testing.assert_allclose(Y * 255, np.round(Y * 255), atol=1e-3)  # decoded 8-bit pixels
    # 28×28 at severity 5: int(28 · 0.65) = 18 px, then nearest back to 28: repeated rows.
    P = cc.corrupt(grey, "pixelate", 5).numpy()
    assert len(np.unique(P[0, 0], axis=0)) <= 18


def test_dtype_device_and_numpy_input(grey) -> None:
    Y = cc.corrupt(grey.double(), "gaussian_noise", 2)
    assert Y.dtype == torch.float64
    assert torch.allclose(Y.float(), cc.corrupt(grey, "gaussian_noise", 2))
    assert torch.equal(cc.corrupt(grey.numpy(), "contrast", 1), cc.corrupt(grey, "contrast", 1))
    empty = cc.corrupt(torch.zeros(0, 1, 28, 28), "pixelate", 3)
    assert empty.shape == (0, 1, 28, 28)


def test_cache_reads_the_file_second_time(grey, tmp_path, monkeypatch) -> None:
    first = cc.corrupted(grey, "shot_noise", 4, seed=3, cache_dir=tmp_path)
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].suffix == ".npy" and "shot_noise_s4_seed3" in files[0].name
    assert np.array_equal(np.load(files[0], allow_pickle=False), first.numpy())

    def fail(*args, **kwargs):
        raise AssertionError("recomputed instead of reading the cache")

    monkeypatch.setattr(cc, "_compute", fail)
    second = cc.corrupted(grey, "shot_noise", 4, seed=3, cache_dir=tmp_path)
    assert torch.equal(first, second)
    with pytest.raises(AssertionError, match="recomputed"):  # other images: another file
        cc.corrupted(grey[:4], "shot_noise", 4, seed=3, cache_dir=tmp_path)


def test_cache_key_env_and_broken_files(grey, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PEG_CACHE", str(tmp_path))
    assert cc.cache_root() == tmp_path / "corruptions"
    Y = cc.corrupted(grey, "contrast", 2, key="fmnist-test")
    path = next((tmp_path / "corruptions").glob("fmnist-test_contrast_s2_seed0_*.npy"))
    assert torch.equal(Y, cc.corrupt(grey, "contrast", 2))
    path.write_bytes(path.read_bytes()[:100])  # truncated: recomputed and replaced
    assert torch.equal(cc.corrupted(grey, "contrast", 2, key="fmnist-test"), Y)
    assert np.load(path, allow_pickle=False).shape == tuple(grey.shape)
    assert not list((tmp_path / "corruptions").glob("*.tmp"))


def test_shifted_sets(grey, tmp_path) -> None:
    sets = list(cc.shifted_sets(grey[:4], severities=(1, 5), seed=2))
    assert [(n, s) for n, s, _ in sets] == [(n, s) for n in cc.applicable(1) for s in (1, 5)]
    for name, severity, Y in sets:
        assert torch.equal(Y, cc.corrupt(grey[:4], name, severity, seed=2))
    cached = list(cc.shifted_sets(grey[:4], ["impulse_noise"], (2,), seed=2, cache_dir=tmp_path))
    assert len(cached) == 1 and len(list(tmp_path.glob("*.npy"))) == 1
    assert [(n, s) for n, s, _ in cc.shifted_sets(grey[:2], "contrast", (4,))] == [("contrast", 4)]
    with pytest.raises(ValueError, match=r"^severity:"):  # checked at the call, not lazily
        cc.shifted_sets(grey, severities=(0,))
    with pytest.raises(ValueError, match=r"^X: saturate"):
        cc.shifted_sets(grey, names=["saturate"])


def test_rotation(grey) -> None:
    assert torch.equal(cc.rotate(grey, 0), grey)
    assert torch.equal(cc.rotate(grey, 360), grey)
    assert cc.rotate(grey, 0).data_ptr() != grey.data_ptr()  # a copy, never a view of X
    Y = cc.rotate(grey, 90)
    expected = torch.rot90(grey, 1, dims=(2, 3))
    torch.testing.assert_close(Y[..., 2:-2, 2:-2], expected[..., 2:-2, 2:-2], atol=1e-5, rtol=0)
    Z = cc.rotate(grey, 45)
    assert Z.shape == grey.shape and float(Z.min()) >= 0 and float(Z.max()) <= 1
    assert float(Z[0, 0, 0, 0]) == 0.0  # corners come from outside: background
    angles = [a for a, _ in cc.rotated_sets(grey[:2])]
    assert angles == list(cc.ROTATION_ANGLES)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"name": "hail"}, "name"),
        ({"name": 3}, "name"),
        ({"severity": 0}, "severity"),
        ({"severity": 6}, "severity"),
        ({"severity": 2.0}, "severity"),
        ({"severity": True}, "severity"),
        ({"seed": -1}, "seed"),
        ({"X": torch.rand(1, 28, 28)}, "X"),
        ({"X": torch.randint(0, 255, (2, 1, 28, 28))}, "X"),
        ({"X": torch.rand(2, 1, 28, 28) * 255}, "X"),
        ({"X": torch.full((2, 1, 28, 28), float("nan"))}, "X"),
        ({"X": torch.rand(2, 2, 28, 28)}, "X"),
        ({"X": [[0.5]]}, "X"),
    ],
)
def test_bad_input_names_the_argument(kwargs, argument) -> None:
    call = {"X": torch.rand(2, 1, 28, 28), "name": "contrast", "severity": 1, **kwargs}
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        cc.corrupt(**call)


def test_bad_input_lists_known_names_and_checks_key_and_degrees(grey, tmp_path) -> None:
    with pytest.raises(ValueError, match="known: gaussian_noise, shot_noise"):
        cc.corrupt(grey, "hail", 1)
    with pytest.raises(ValueError, match=r"^key:"):
        cc.corrupted(grey, "contrast", 1, cache_dir=tmp_path, key="../escape")
    with pytest.raises(ValueError, match=r"^degrees:"):
        cc.rotate(grey, "90")
    with pytest.raises(ValueError, match=r"^degrees:"):
        cc.rotate(grey, float("inf"))


def test_the_parameter_table_is_rendered_from_the_records():
    """One record per corruption: the docstring's table and docs/data.md's are its rendering."""
    rendered = table()
    assert rendered in (cc.__doc__ or "") and "{table}" not in (cc.__doc__ or "")
    docs = Path(__file__).resolve().parents[2] / "docs" / "data.md"
    assert rendered in docs.read_text(encoding="utf-8"), "paste _corruption_records.table()"
    assert len(rendered.splitlines()) == 2 + len(cc.CORRUPTIONS)
    assert "| saturate | HSV saturation S·a + b: a, b | .3, 0 |" in rendered
