"""The CIFAR-10 half of `benchmarks/label_free.py`: the `cifar10-adam` preset's model (member 0
of its deep ensemble, the one `_cifar_logits.preset_cnn_logits` trains; loaded from
`--bench-cache`, trained there first if absent: 219 s), its logits on the preset's clean
validation split (the source) and on the target sets, each cached as `.npy` under
`--cache/cifar10-adam/`, so a rerun is cheap.

Targets, from the preset's 5,000 test images: each of CIFAR-10-C's 19 corruptions (peg's colour
corruptions less `box_blur`) × severities
1–5 (`peg.data.corruptions`, seed 0); the clean test images resampled to Dirichlet(0.3) class
priors (`--draws` draws); each corruption at severity 3 resampled to one Dirichlet(0.3) draw.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from peg.apps.bench.bases import Bases
from peg.apps.bench.seed import SeedRun
from peg.apps.bench.spec import find_spec, load_specs
from peg.data import corruptions as cc

PRESET = "cifar10-adam"
# CIFAR-10-C's 19 (peg's colour corruptions less its own box_blur)
CORRUPTIONS = tuple(n for n in cc.applicable(3) if n != "box_blur")


def preset_model(bench_cache: str, root: str | None) -> tuple[torch.nn.Module, SeedRun]:
    """The preset's member 0 (eval mode) and its `SeedRun` (`.val`, `.test` images, labels)."""
    spec = load_specs(find_spec(PRESET))[0]
    run = SeedRun(spec, 0, Path(bench_cache), root, progress=False)
    run.bases = Bases(
        run.factory, run.train, spec.train, None, 0, 1, spec.swag_samples, run.cache, False, run.val
    )
    return run.bases.get("single").eval(), run


class CifarSets:
    """Source logits, target sets and the model of the CIFAR-10 half (see the module)."""

    def __init__(self, args) -> None:
        self.args = args
        self.folder = Path(args.cache) / PRESET
        self.folder.mkdir(parents=True, exist_ok=True)
        self._run: SeedRun | None = None
        self._model: torch.nn.Module | None = None

    def _load(self) -> None:
        if self._run is None:
            self._model, self._run = preset_model(self.args.bench_cache, self.args.data_root)

    @property
    def model(self) -> torch.nn.Module:
        self._load()
        return self._model

    def logits(self, name: str, images) -> np.ndarray:
        """Logits `[N, 10]` of `images()` (called only on a cache miss), cached as `name`."""
        path = self.folder / f"logits-{name}.npy"
        if path.is_file():
            return np.load(path, allow_pickle=False)
        X = images()  # may train the preset's model first: outside no_grad
        with torch.no_grad():
            out = torch.cat([self.model(X[i : i + 500]) for i in range(0, len(X), 500)]).numpy()
        np.save(path, out)
        return out

    def labels(self, split: str) -> np.ndarray:
        path = self.folder / f"labels-{split}.npy"
        if path.is_file():
            return np.load(path, allow_pickle=False)
        self._load()
        y = (self._run.val if split == "val" else self._run.test)[1].numpy()
        np.save(path, y)
        return y

    def source(self) -> tuple[np.ndarray, np.ndarray]:
        """The clean validation split's logits `[N_val, 10]` and labels (the source)."""
        return self.logits("val", lambda: self._images("val")), self.labels("val")

    def val_images(self) -> torch.Tensor:
        return self._images("val")

    def _images(self, split: str) -> torch.Tensor:
        self._load()
        return (self._run.val if split == "val" else self._run.test)[0]

    def sets(self) -> Iterator[tuple[str, str, np.ndarray, np.ndarray]]:
        """(kind, name, logits, labels) of every target set, as `label_free._sets` yields."""
        y = self.labels("test")
        rng = np.random.default_rng(0)

        def resample(n: int) -> np.ndarray:
            q = rng.dirichlet(np.full(10, 0.3))
            counts = rng.multinomial(n, q)
            picks = [rng.choice(np.nonzero(y == c)[0], k) for c, k in enumerate(counts)]
            return np.concatenate(picks)

        clean = self.logits("test-clean", lambda: self._images("test"))
        yield "clean", "clean", clean, y
        for d in range(self.args.draws):
            idx = resample(len(y))
            yield "label shift", f"dirichlet {d}", clean[idx], y[idx]
        for name in CORRUPTIONS:
            for severity in (1, 2, 3, 4, 5):
                logits = self.logits(
                    f"test-{name}-{severity}",
                    lambda n=name, s=severity: cc.corrupt(self._images("test"), n, s, seed=0),
                )
                yield "corruption", f"{name} {severity}", logits, y
                if severity == 3:
                    idx = resample(len(y))
                    yield "corruption + label shift", f"{name} 3 + dirichlet", logits[idx], y[idx]
