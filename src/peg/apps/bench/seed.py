"""One seed of one benchmark: data, bases, evaluation sets, and every method's cached member
logits (`SeedRun`); methods are built through the registry (`peg.apps.registry`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from peg import data as datasets
from peg import models
from peg.apps import registry
from peg.apps.bench.bases import Bases
from peg.apps.bench.spec import BASE_PATTERN, MethodSpec, Spec
from peg.apps.chain import as_base, chained_seconds
from peg.apps.data import subsample
from peg.data import corruptions, transforms
from peg.errors import SpecError
from peg.methods._predictors import member_logits_of
from peg.train import instantiate, train
from peg.utils.io import atomic_write_text, load_tree, save_tree

# what a seed's cached bases and logits depend on besides the spec's name, recipes and methods
# (the recipes are checked by the checkpoints themselves)
DATA_FIELDS = ("data", "data_options", "model", "val_fraction", "train_points", "test_points")


def check_cache(folder: Path, spec: Spec) -> None:
    """Refuse a seed's cache folder made for other data: its `data.json` records the spec's
    `DATA_FIELDS`, written on first use (a folder from before it existed is adopted as is)."""
    made = json.loads(json.dumps({k: getattr(spec, k) for k in DATA_FIELDS}))  # as JSON reads
    record = folder / "data.json"
    if not record.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(record, json.dumps(made, indent=1, sort_keys=True))
        return
    cached = json.loads(record.read_text())
    changed = sorted(k for k in DATA_FIELDS if cached.get(k) != made[k])
    if changed:
        was = ", ".join(f"{k}={cached.get(k)!r}" for k in changed)
        now = ", ".join(f"{k}={made[k]!r}" for k in changed)
        raise SpecError(
            f"cache: {folder} holds bases and logits made with {was}; this spec has {now}. "
            "Give the spec another name, pass --cache elsewhere, or delete the folder"
        )


class SeedRun:
    """One seed of one spec: data, bases, evaluation sets, cached member logits."""

    def __init__(
        self,
        spec: Spec,
        seed: int,
        cache: Path,
        root: str | None = None,
        progress: bool | None = None,
    ) -> None:
        self.spec, self.seed, self.progress, self.root = spec, seed, progress, root
        self.cache = cache / spec.name / f"seed-{seed}"
        check_cache(self.cache, spec)
        X, y = datasets.load(spec.data, "train", root=root, seed=seed, **spec.data_options)
        X_tr, y_tr, X_val, y_val = datasets.train_val_split(X, y, spec.val_fraction, seed=seed)
        self.train = subsample(X_tr, y_tr, spec.train_points, seed, sort=True)
        self.val = (X_val, y_val)
        X_test, y_test = datasets.load(spec.data, "test", root=root, seed=seed, **spec.data_options)
        self.test = subsample(X_test, y_test, spec.test_points, seed, sort=True)
        self.num_classes = int(torch.cat([y_tr, y_val]).max()) + 1
        self.bases = Bases(
            self.factory,
            self.train,
            spec.train,
            spec.swa,
            seed,
            spec.deep_ensemble_size,
            spec.swag_samples,
            self.cache,
            progress,
            self.val,
        )
        self.fitted: dict[str, Any] = {}  # predictors built in this process, by column name

    def factory(self, **extra: Any) -> nn.Module:
        shape = tuple(self.train[0].shape[1:])
        options = {k: v for k, v in self.spec.model.items() if k != "name"} | extra
        if self.spec.model["name"] == "mlp":
            options.setdefault("in_features", int(torch.tensor(shape).prod()))
        else:
            options.setdefault("in_channels", shape[0])
        return models.build(self.spec.model["name"], num_classes=self.num_classes, **options)

    def eval_sets(self) -> dict[str, Callable[[], Tensor]]:
        """Data set name → inputs (built lazily: a cached run never materialises them)."""
        X = self.test[0]
        key = f"{self.spec.data}-test-{self.spec.test_points}-{self.seed}"
        sets: dict[str, Callable[[], Tensor]] = {"test": lambda: X}
        for deg in self.spec.rotations:
            sets[f"rotate-{deg:g}"] = lambda deg=deg: corruptions.rotate(X, deg)
        for name in self.spec.corruptions:
            for sev in self.spec.severities:
                sets[f"{name}-{sev}"] = lambda name=name, sev=sev: corruptions.corrupted(
                    X, name, sev, seed=self.seed, key=key
                )
        for name in self.spec.ood:
            sets[f"{name} (OOD)"] = lambda name=name: self._ood_inputs(name)
        return sets

    def _ood_inputs(self, name: str) -> Tensor:
        X, _ = datasets.load(name, "test", root=self.root, seed=self.seed)
        X = subsample(X, None, self.spec.test_points, self.seed, sort=True)[0]
        return fit_images(X, tuple(self.test[0].shape[1:]), name)

    def _train_own(
        self, tag: str, net: nn.Module, loss: Callable[[Tensor, Tensor], Tensor]
    ) -> nn.Module:
        """Train a method's own model with the spec's recipe (checkpointed, resumable)."""
        train(
            net,
            self.train,
            self.spec.train,
            seed=self.seed,
            loss=loss,
            checkpoint=self.cache / f"{tag}.safetensors",
            progress=self.progress,
            val=self.val if self.spec.train.patience is not None else None,
        )
        return net

    def site(self, method: MethodSpec) -> registry.Site:
        """Where `method` is built: its base, the validation and training data, a fresh model
        of the spec and the spec's recipe to train one (Packed, EMP, ECMP)."""
        return registry.Site(
            seed=self.seed,
            progress=self.progress,
            base=lambda: self.base(method),
            val=self.val,
            train=self.train,
            score_points=self.spec.score_points,
            model=lambda **extra: instantiate(lambda: self.factory(**extra), self.seed),
            fit_model=lambda net, loss: self._train_own(method.key, net, loss),
        )

    def base(self, method: MethodSpec) -> Any:
        """The base `method` is fitted on: a base solution (trained or loaded), or the fitted
        predictor of the earlier column it names (built again if this process has not built
        it), as `peg.apps.chain.as_base` hands it to the method."""
        if BASE_PATTERN.match(method.base):
            return self.bases.get(method.base)
        if method.base not in self.fitted:
            earlier = next(m for m in self.spec.methods if m.name == method.base)
            self.fitted[method.base] = self.build(earlier)
        return as_base(self.fitted[method.base], method.method, method.base)

    def build(self, method: MethodSpec) -> Any:
        """The fitted predictor of one method (nn.Module, Ensemble or a fitted method)."""
        predictor = registry.build(method.method, self.site(method), **method.options)
        self.fitted[method.name] = predictor
        return predictor

    def logits(self, method: MethodSpec) -> dict[str, Tensor]:
        """Member logits `[M, N, C]` of one method on every evaluation set (cached)."""
        folder = self.cache / "logits" / method.key
        out: dict[str, Tensor] = {}
        predictor, info = None, self.info(method)
        for name, inputs in self.eval_sets().items():
            path = folder / f"{_file_name(name)}.safetensors"
            if path.exists():
                out[name] = load_tree(path)["logits"]
                continue
            if predictor is None:
                predictor, info = self._timed_build(method)
            started = time.perf_counter()
            out[name] = member_logits_of(predictor, inputs())
            if name == "test":
                info["predict_seconds"] = time.perf_counter() - started
                info["forwards"] = float(out[name].shape[0])
                save_tree(folder / "build.safetensors", info)
            save_tree(path, {"logits": out[name]})
        return out

    def _timed_build(self, method: MethodSpec) -> tuple[Any, dict[str, float]]:
        """Build `method`, timing its fit alone: its base is trained or loaded first (a base
        solution's training is not counted), and a column on an earlier column counts that
        column's fit time too (`peg.apps.chain.chained_seconds`)."""
        if not registry.entry(method.method).trains:
            self.base(method)
        started = time.perf_counter()
        predictor = self.build(method)
        own = time.perf_counter() - started
        earlier = {method.base: self.info_by_name(method.base).get("seconds", 0.0)}
        info = self.info(method) | {"seconds": chained_seconds(own, method.base, earlier)}
        info |= registry.scales(predictor)  # (a resumed run keeps its test set's timing)
        save_tree(self.cache / "logits" / method.key / "build.safetensors", info)
        return predictor, info

    def info_by_name(self, name: str) -> dict[str, float]:
        found = [m for m in self.spec.methods if m.name == name]
        return self.info(found[0]) if found else {}

    def info(self, method: MethodSpec) -> dict[str, float]:
        """What building `method` recorded: fit seconds (the base solution's training not
        counted), the chosen η, σ or T, and the test set's prediction seconds and forwards
        per input (members)."""
        path = self.cache / "logits" / method.key / "build.safetensors"
        return dict(load_tree(path)) if path.exists() else {}


def fit_images(X: Tensor, target: tuple[int, ...], name: str) -> Tensor:
    """OOD images `[N, c, h, w]` brought to the model's input shape `target` = (C, H, W).

    28×28 grey into 32×32×3 is padded (the papers' MNIST-as-OOD-for-CIFAR convention); any
    other size is resized (bilinear, antialiased) and a single channel repeated.
    """
    if X.ndim != 4 or len(target) != 3:
        raise ValueError(f"ood: {name} inputs {tuple(X.shape[1:])} cannot be fitted to {target}")
    if tuple(X.shape[1:]) == (1, 28, 28) and target == (3, 32, 32):
        return transforms.pad_to(X, 32, 3)
    C, H, W = target
    if X.shape[2:] != (H, W):
        X = torch.nn.functional.interpolate(X, size=(H, W), mode="bilinear", antialias=True)
    if X.shape[1] != C:
        if X.shape[1] != 1:
            raise ValueError(f"ood: {name} has {X.shape[1]} channels, the model takes {C}")
        X = X.repeat(1, C, 1, 1)
    return X.clamp(0, 1)


def _file_name(dataset: str) -> str:
    return dataset.replace(" ", "_").replace("(", "").replace(")", "")
