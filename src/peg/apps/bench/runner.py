"""`peg bench SPEC.yaml`: train or load the bases, build every method, evaluate, tabulate.

Per seed: the training split is divided (stratified, seeded) into training and validation
parts; bases are trained lazily and checkpointed (`peg.apps.bench.bases`); each method is built on
its base and predicts every evaluation set: the test split, its shifted versions (rotations,
corruptions at chosen severities) and the OOD sets. Member logits are cached per (seed, method,
data set) as safetensors, so metrics and tables are recomputed without re-running models and an
interrupted run resumes where it stopped. Metrics: NLL, error, Brier, ECE, MCE on the test and
shifted sets; AUROC, AUPR (OOD positive) and FPR95 of the OOD sets against the test set.

Writes `results/<name>/results.json` (shape: `{"command", "commit", "machine", "datasets":
{DATASET: {METHOD: {METRIC: {"mean", "std", "n"}}}}, ...}`) and `results/<name>/results.md`
(one table per data set; rows metrics, columns methods; mean ± std over seeds).
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from peg import data as datasets
from peg import distributed, metrics, models
from peg._env import git_commit, machine
from peg._io import atomic_write_text, load_tree, save_tree
from peg._progress import bar
from peg.apps.bench.bases import Bases
from peg.apps.bench.spec import MethodSpec, Spec
from peg.apps.bench.tables import OOD_ROWS, ROWS, markdown_table
from peg.data import corruptions, transforms
from peg.ensemble import Ensemble
from peg.layers.patching import emp_loss, patch
from peg.losses import packed_loss
from peg.methods.dropout import MCDropout
from peg.methods.packed import PackedEnsemble
from peg.methods.patching import MCPatched
from peg.methods.peg import PEG
from peg.methods.pep import PEP
from peg.methods.subspace import DropoutSubspace, RandomSubspace
from peg.methods.swag import has_batchnorm
from peg.methods.temperature import TemperatureScaling, member_logits_of
from peg.metrics.ood import ood_metrics
from peg.models._packed import Packing
from peg.train import instantiate, train

CLASSIFICATION = ("nll", "error", "brier", "ece", "mce")
TRAINED = object()  # marks methods that train their own model (Packed, EMP, ECMP)
OOD = ("auroc", "aupr", "aupr_in", "fpr95")


def _subsample(X: Tensor, y: Tensor, n: int | None, seed: int) -> tuple[Tensor, Tensor]:
    if n is None or n >= len(X):
        return X, y
    idx = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))[:n].sort().values
    return X[idx], y[idx]


def _unfitted(method: MethodSpec, spec: Spec, seed: int, progress: bool | None) -> Any:
    """The method's object, configured but not fitted (built first to validate options)."""
    o = dict(method.options)
    common = {"seed": seed, "progress": progress}
    if method.method == "peg":
        o.setdefault("eta", "search")
        o.setdefault("max_score_points", spec.score_points)
        return PEG(**common, **o)
    if method.method == "pep":
        o.setdefault("max_score_points", spec.score_points)
        return PEP(**common, **o)
    if method.method == "temperature":
        return TemperatureScaling(**o)
    if method.method == "mc-dropout":
        return MCDropout(**common, **o)
    if method.method == "random-subspace":
        return RandomSubspace(**common, **o)
    if method.method == "dropout-subspace":
        return DropoutSubspace(**common, **o)
    if method.method == "packed":
        Packing(**o)  # validates alpha, num_estimators, gamma
        return TRAINED
    if method.method in ("emp", "ecmp"):
        unknown = sorted(set(o) - {"k", "n_members", "layers", "weight"})
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}; known: k, n_members, layers, weight")
        return TRAINED
    if method.options:
        raise ValueError(f"{method.name}: a base takes no options, got {method.options}")
    return None


def check_methods(spec: Spec) -> None:
    """Construct every method once so bad options fail before any training."""
    for i, method in enumerate(spec.methods):
        try:
            _unfitted(method, spec, spec.seeds[0], False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"methods[{i}] ({method.name}): {e}") from None


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
        X, y = datasets.load(spec.data, "train", root=root, seed=seed, **spec.data_options)
        X_tr, y_tr, X_val, y_val = datasets.train_val_split(X, y, spec.val_fraction, seed=seed)
        self.train = _subsample(X_tr, y_tr, spec.train_points, seed)
        self.val = (X_val, y_val)
        X_test, y_test = datasets.load(spec.data, "test", root=root, seed=seed, **spec.data_options)
        self.test = _subsample(X_test, y_test, spec.test_points, seed)
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
        )

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
        X = _subsample(X, torch.zeros(len(X)), self.spec.test_points, self.seed)[0]
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
        )
        return net

    def _build_trained(self, method: MethodSpec) -> Any:
        """Packed-Ensembles and EMP/ECMP: models trained as such, with the same recipe."""
        o = method.options
        if method.method == "packed":
            spec = Packing(**o)
            net = instantiate(lambda: self.factory(packed=spec), self.seed)
            return PackedEnsemble().fit(self._train_own(method.key, net, packed_loss))
        net = instantiate(self.factory, self.seed)
        layers = o.get("layers", "bn" if has_batchnorm(net) else "input+output")
        patch(net, k=o.get("k", 5), mode=method.method, layers=layers, seed=self.seed)
        # Eq. (6) on the patched components (prior precision 1 over N points); the shared
        # layers keep the recipe's weight decay (shared=False: not penalised twice)
        loss = emp_loss(net, o.get("weight", 1.0 / len(self.train[0])), shared=False)
        self._train_own(method.key, net, loss)
        return MCPatched(n_members=o.get("n_members", 20), seed=self.seed).fit(net)

    def build(self, method: MethodSpec) -> Any:
        """The fitted predictor of one method (nn.Module, Ensemble or a fitted method)."""
        fitted = _unfitted(method, self.spec, self.seed, self.progress)
        if fitted is TRAINED:
            return self._build_trained(method)
        base = self.bases.get(method.base)
        if fitted is None:
            return base
        if method.method in ("mc-dropout", "random-subspace", "dropout-subspace") and isinstance(
            base, Ensemble
        ):
            raise ValueError(f"{method.name}: needs a single model as base, got {method.base}")
        return fitted.fit(base, self.val)

    def logits(self, method: MethodSpec) -> dict[str, Tensor]:
        """Member logits `[M, N, C]` of one method on every evaluation set (cached)."""
        folder = self.cache / "logits" / method.key
        out: dict[str, Tensor] = {}
        predictor = None
        for name, inputs in self.eval_sets().items():
            path = folder / f"{_file_name(name)}.safetensors"
            if path.exists():
                out[name] = load_tree(path)["logits"]
                continue
            if predictor is None:
                started = time.perf_counter()
                predictor = self.build(method)
                info = {"seconds": time.perf_counter() - started}
                for attr, label in (("eta_", "eta"), ("sigma_", "sigma"), ("temperature_", "T")):
                    if hasattr(predictor, attr):
                        info[label] = float(getattr(predictor, attr))
                save_tree(folder / "build.safetensors", info)
            out[name] = member_logits_of(predictor, inputs())
            save_tree(path, {"logits": out[name]})
        return out

    def info(self, method: MethodSpec) -> dict[str, float]:
        """What building `method` recorded: seconds, and the chosen η, σ or T."""
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


def _summary(values: list[float]) -> dict[str, float]:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "std": std, "n": len(values)}


def _family(method: MethodSpec) -> str:
    """The training a method shares with others: "deep-ensemble" (Single, DeepEns-N and what is
    built on them), "swag" (SWA, SWAG, SWAG-Diag and what is built on them), or the method's own
    key (Packed, EMP and ECMP each train a model of their own)."""
    if method.method in ("packed", "emp", "ecmp"):
        return method.key
    return "swag" if method.base in ("swa", "swag", "swag-diag") else "deep-ensemble"


def work_units(spec: Spec) -> list[tuple[int, list[MethodSpec]]]:
    """(seed, methods) units that share no training, family by family, then seed by seed.

    Under torchrun, unit i goes to rank i mod W, in rounds of W units: with a number of seeds
    that is a multiple of W, the units of one round are one family on different seeds, so the
    ranks of a round do the same amount of work.
    """
    families: dict[str, list[MethodSpec]] = {}
    for method in spec.methods:
        families.setdefault(_family(method), []).append(method)
    return [(seed, methods) for methods in families.values() for seed in spec.seeds]


def _fill_cache(
    spec: Spec,
    cache: Path,
    root: str | None,
    progress: bool | None,
    say: Callable[[str], None],
) -> None:
    """Under torchrun: every rank caches the member logits of its share of `work_units`.

    The ranks meet after every round (`distributed.guarded`): a rank that raised stops every
    rank with a `RankFailure` naming it, before the next round starts.
    """
    rank, size = distributed.world()
    units = work_units(spec)
    runs: dict[int, SeedRun] = {}

    def do(seed: int, methods: list[MethodSpec]) -> None:
        say(f"{spec.name}: rank {rank}: seed {seed}: {', '.join(m.name for m in methods)}")
        if seed not in runs:
            runs[seed] = SeedRun(spec, seed, cache, root, progress)
        for method in bar(methods, f"{spec.name} seed {seed} rank {rank}", len(methods), progress):
            runs[seed].logits(method)

    for first in range(0, len(units), size):
        if first + rank < len(units):
            seed, methods = units[first + rank]
            task = functools.partial(do, seed, methods)
            what = f"{spec.name}, seed {seed}, {', '.join(m.name for m in methods)}"
        else:  # the last round has fewer units than ranks
            task, what = (lambda: None), f"{spec.name}, idle"
        distributed.guarded(task, what)


def run_spec(
    spec: Spec,
    out: str | Path = "results",
    cache: str | Path = ".peg-cache/bench",
    root: str | None = None,
    progress: bool | None = None,
    command: str | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run one benchmark; write and return its results (see the module docstring).

    Under torchrun (`peg.distributed.world()` finds W > 1 ranks) the ranks share the work units
    (`work_units`) and fill the cache; then rank 0 alone computes the metrics from it and
    writes the results, which every rank returns: those of one process (`commit`,
    `wall_seconds` and `command` aside). If any rank fails, every rank raises
    `peg.distributed.RankFailure` naming it, and no results are written (the logits cached so
    far stay: a rerun resumes from them).
    """
    check_methods(spec)
    started = time.perf_counter()
    rank, size = distributed.world()

    def finish() -> dict[str, Any]:
        per_seed = _per_seed(spec, Path(cache), root, progress, say)
        return _write(spec, per_seed, out, command, time.perf_counter() - started, say)

    if size == 1:
        return finish()
    _fill_cache(spec, Path(cache), root, progress, say)
    return distributed.guarded(finish if rank == 0 else lambda: None, f"{spec.name}, results")[0]


def _per_seed(
    spec: Spec, cache: Path, root: str | None, progress: bool | None, say: Callable[[str], None]
) -> dict[str, dict[str, dict[str, list[float]]]]:
    """Data set → method → metric → one value per seed, from the member logits (built and
    cached where the cache does not have them yet)."""
    per_seed: dict[str, dict[str, dict[str, list[float]]]] = {}
    for seed in spec.seeds:
        say(f"{spec.name}: seed {seed}")
        run = SeedRun(spec, seed, cache, root, progress)
        y = run.test[1]
        for method in bar(spec.methods, f"{spec.name} seed {seed}", len(spec.methods), progress):
            logits = run.logits(method)
            for name, value in logits.items():
                cell = per_seed.setdefault(name, {}).setdefault(method.name, {})
                if name.endswith("(OOD)"):
                    m = ood_metrics(logits["test"], value, spec.ood_score)
                    m = {"auroc": m["auroc"], "aupr": m["aupr_out"], "aupr_in": m["aupr_in"],
                         "fpr95": m["fpr95"]}  # fmt: skip
                else:
                    m = metrics.classification_metrics(value, y)
                for k, v in m.items():
                    if k in CLASSIFICATION or k in OOD:
                        cell.setdefault(k, []).append(float(v))
    return per_seed


def _write(
    spec: Spec,
    per_seed: dict[str, dict[str, dict[str, list[float]]]],
    out: str | Path,
    command: str | None,
    wall: float,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """The results (see the module docstring), written to results.json and results.md."""
    results = {
        "command": command or f"peg bench {spec.name}",
        "commit": git_commit(),
        "machine": machine(),
        "name": spec.name,
        "data": spec.data,
        "model": spec.model,
        "seeds": list(spec.seeds),
        "wall_seconds": wall,
        "ood": {"positive": "ood", "score": spec.ood_score, "against": "test"},
        "datasets": {
            d: {m: {k: _summary(v) for k, v in cell.items()} for m, cell in methods.items()}
            for d, methods in per_seed.items()
        },
        "per_seed": per_seed,
    }
    text = report(results, spec)
    folder = Path(out) / spec.name
    atomic_write_text(folder / "results.json", json.dumps(results, indent=2) + "\n")
    atomic_write_text(folder / "results.md", text)
    say(text)
    return results


def report(results: dict[str, Any], spec: Spec) -> str:
    """Markdown: a header with provenance, then one table per data set."""
    lines = [
        f"# {spec.name}: {spec.data}, {spec.model['name']}",
        "",
        f"Seeds {results['seeds']} (mean ± std). Command: `{results['command']}`; commit "
        f"{results['commit']}; machine: {results['machine']}; wall time "
        f"{results['wall_seconds']:.0f} s (cached logits are not recomputed). OOD sets: OOD is "
        f"the positive class, score = {spec.ood_score}, against the test set.",
        "",
    ]
    for dataset, methods in results["per_seed"].items():
        rows = OOD_ROWS if dataset.endswith("(OOD)") else ROWS
        lines += [f"## {dataset}", "", markdown_table(methods, rows), ""]
    return "\n".join(lines)
