"""One record per corruption of `peg.data.corruptions`: its function, its parameters by name
(one value per severity 1..5, CIFAR-10-C's at 32×32), what they mean and the channels it
takes. The records are the only place a parameter is written: `corruptions` applies them
(`function(x, rng, scale, **record.at(severity))`) and renders its table from them (`table`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from peg.data import _corruption_blur as blur
from peg.data import _corruption_functions as fn
from peg.data import _corruption_weather as weather

Array = np.ndarray


@dataclass(frozen=True)
class Corruption:
    """A corruption: `function(x, rng, scale, **at(severity))` on images `[N, C, H, W]`."""

    name: str
    function: Callable[..., Array]
    meaning: str  # the parameters, as the table's "parameters (32×32)" column says them
    parameters: Mapping[str, tuple[Any, ...]]  # name → its values at severities 1..5
    channels: tuple[int, ...] = (1, 3)
    needs: Callable[[], object] | None = None  # called before any work: what it must have

    def __post_init__(self) -> None:
        assert all(len(v) == 5 for v in self.parameters.values()), self.name
        object.__setattr__(self, "parameters", MappingProxyType(dict(self.parameters)))

    def at(self, severity: int) -> dict[str, Any]:
        """The parameters at `severity` (1..5), by name."""
        return {k: v[severity - 1] for k, v in self.parameters.items()}


def _record(name: str, function: Callable[..., Array], meaning: str, **kw: Any) -> Corruption:
    extra = {k: kw.pop(k) for k in ("channels", "needs") if k in kw}
    return Corruption(name, function, meaning, kw, **extra)


# fmt: off
RECORDS: tuple[Corruption, ...] = (
    _record("gaussian_noise", fn.gaussian_noise, "σ of x + N(0, σ²)",
            sigma=(0.04, 0.06, 0.08, 0.09, 0.10)),
    _record("shot_noise", fn.shot_noise, "photons λ: Poisson(λx)/λ",
            photons=(500, 250, 100, 75, 50)),
    _record("impulse_noise", fn.impulse_noise, "salt-and-pepper fraction",
            amount=(0.01, 0.02, 0.03, 0.05, 0.07)),
    _record("speckle_noise", fn.speckle_noise, "σ of x + x·N(0, σ²)",
            sigma=(0.06, 0.10, 0.12, 0.16, 0.20)),
    _record("defocus_blur", fn.defocus_blur, "disk radius, anti-alias σ (px)",
            radius=(0.3, 0.4, 0.5, 1.0, 1.5), alias_blur=(0.4, 0.5, 0.6, 0.2, 0.1)),
    _record("glass_blur", blur.glass_blur, "σ, max shift δ (px), passes",
            sigma=(0.05, 0.25, 0.4, 0.25, 0.4), delta=(1, 1, 1, 1, 1),
            iterations=(1, 1, 1, 2, 2)),
    _record("motion_blur", blur.motion_blur, "radius, σ (px); angle U(±45°)",
            radius=(6, 6, 6, 8, 9), sigma=(1.0, 1.5, 2.0, 2.0, 2.5)),
    _record("zoom_blur", blur.zoom_blur, "zooms 1, 1.01, .. below this end",
            end=(1.06, 1.11, 1.16, 1.21, 1.26)),
    _record("gaussian_blur", fn.gaussian_blur, "σ (px)", sigma=(0.4, 0.6, 0.7, 0.8, 1.0)),
    _record("box_blur", fn.box_blur, "box width (px)", width=(2.0, 2.5, 3.0, 4.0, 5.0)),
    _record("snow", weather.snow,
            "flakes N(loc, spread), zoom, threshold; motion radius, σ; mix",
            loc=(0.1, 0.1, 0.15, 0.25, 0.3), spread=(0.2, 0.2, 0.3, 0.3, 0.3),
            zoom=(1.0, 1.0, 1.75, 2.25, 1.25), threshold=(0.6, 0.5, 0.55, 0.6, 0.65),
            radius=(8, 10, 10, 12, 14), sigma=(3, 4, 4, 6, 12),
            mix=(0.95, 0.9, 0.9, 0.85, 0.8)),
    _record("frost", weather.frost, "keep·x + add·frost: keep, add",
            keep=(1.0, 1.0, 0.9, 0.85, 0.75), add=(0.2, 0.3, 0.4, 0.4, 0.45),
            needs=weather.frost_photos),
    _record("fog", weather.fog, "amount, fractal decay",
            amount=(0.2, 0.5, 0.75, 1.0, 1.5), decay=(3.0, 3.0, 2.5, 2.0, 1.75)),
    _record("spatter", weather.spatter,
            "liquid N(loc, spread), blur σ, threshold; strength (mud: its blur σ); mud",
            loc=(0.62, 0.65, 0.65, 0.65, 0.65), spread=(0.1, 0.1, 0.3, 0.1, 0.1),
            sigma=(0.7, 0.8, 1.0, 0.7, 0.5), threshold=(0.7, 0.7, 0.69, 0.69, 0.68),
            strength=(0.5, 0.5, 0.5, 0.6, 0.6), is_mud=(0, 0, 0, 1, 1)),
    _record("contrast", fn.contrast, "factor c: (x − mean)·c + mean",
            factor=(0.75, 0.5, 0.4, 0.3, 0.15)),
    _record("brightness", fn.brightness, "added to HSV value",
            shift=(0.05, 0.1, 0.15, 0.2, 0.3)),
    _record("saturate", fn.saturate, "HSV saturation S·a + b: a, b",
            a=(0.3, 0.1, 1.5, 2.0, 2.5), b=(0.0, 0.0, 0.0, 0.1, 0.2), channels=(3,)),
    _record("elastic_transform", blur.elastic_transform,
            "α, σ, affine shift, as fractions of the side",
            alpha=(0.0, 0.05, 0.08, 0.1, 0.1), sigma=(0.0, 0.2, 0.06, 0.04, 0.03),
            shift=(0.08, 0.07, 0.06, 0.05, 0.03)),
    _record("pixelate", fn.pixelate, "size factor (BOX down, NEAREST up)",
            factor=(0.95, 0.9, 0.85, 0.75, 0.65)),
    _record("jpeg_compression", fn.jpeg_compression, "Pillow JPEG quality",
            quality=(80, 65, 58, 50, 40)),
)
# fmt: on
BY_NAME: Mapping[str, Corruption] = MappingProxyType({r.name: r for r in RECORDS})


def _number(value: Any) -> str:
    """A value as the table writes it: 0.05 → .05, 1.0 → 1, 500 → 500."""
    text = f"{value:g}"
    return text[1:] if text.startswith("0.") else text


def table() -> str:
    """The Markdown table of every corruption's parameters at severities 1..5 (32×32)."""
    lines = [
        "| name | parameters (32×32) | 1 | 2 | 3 | 4 | 5 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in RECORDS:
        cells = [", ".join(_number(v) for v in r.at(s).values()) for s in range(1, 6)]
        lines.append(f"| {r.name} | {r.meaning} | {' | '.join(cells)} |")
    return "\n".join(lines)
