"""`peg bench uci`: the UCI regression benchmark (the MC-dropout / EMP protocol) for every method.

Per data set and standard split k (`index_train_k.txt` / `index_test_k.txt`; 20 splits, Protein
5): inputs and targets are standardised with the training split's statistics; the last 10% of
the (shuffled, seeded) training split is held out as validation data for the post-hoc methods'
scale search, and every base model is trained on the other 90%. Network: one hidden layer of
`n_hidden.txt` ReLU units (50; Protein 100, the EMP paper's setting) with a Gaussian head (mean,
log-variance), trained for `n_epochs.txt` epochs (40; Protein 20, the MC-dropout protocol) with
Adam on the Gaussian NLL. The EMP paper trains for 4000 epochs with a fixed τ = 0.1; we keep the
standard split files' epochs so the whole benchmark runs on a CPU, and learn the variance.

Methods: `Single`, `DeepEns-5`, `MC-Dropout` (p = 0.05 before each linear layer, 50 samples),
`EMP` and `ECMP` (K = 5 components on the input and output layers, 50 samples),
`Packed-(2,4,1)` (the same MLP packed, Gaussian heads, the members' mean Gaussian NLL), `PEP-10`
and `PEG-10` on the single model. Metrics in the data's units: RMSE and LPD (log predictive density
of the members' Gaussian mixture), mean ± standard error over splits. Test outputs `[M, N, 2]`
are cached per (set, split, method): an interrupted run resumes, a rerun only tabulates.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from peg import data as datasets
from peg.apps import registry
from peg.apps.bench.folders import claim_bench
from peg.apps.bench.spec import MethodSpec
from peg.apps.results import write_results
from peg.data.uci import UCI_SETS, uci_n_splits, uci_normalise
from peg.ensemble import Ensemble
from peg.losses import gaussian_nll_loss, packed_gaussian_nll
from peg.methods._predictors import member_logits_of
from peg.methods.trained.deep_ensemble import DeepEnsemble
from peg.metrics.regression import log_predictive_density, rmse, split_gaussian
from peg.models import MLP
from peg.models.gaussian import RegressionMLP
from peg.train import Recipe, instantiate, train
from peg.utils.env import git_commit, machine
from peg.utils.io import load_tree, save_tree
from peg.utils.progress import bar

HIDDEN = {"protein": 100}
EPOCHS = {"protein": 20}
MC_SAMPLES = 50
DROPOUT = 0.05
EMP_WEIGHT = 1e-4  # weight of the Eq. (6) regulariser added to the mean Gaussian NLL
PATCHED = {"k": 5, "layers": "input+output", "weight": EMP_WEIGHT, "shared": True}


def _peg_batch(split: Split) -> int:
    return min(32, len(split.val[0]) // 2)


# The columns: registry key (`peg.apps.registry`), base and options of each. An option given
# as a function is evaluated on the split (PEG's gradient batch: half the validation points).
SPECS: tuple[MethodSpec, ...] = (
    MethodSpec("Single", "base", "single"),
    MethodSpec("DeepEns-5", "base", "deepens-5"),
    MethodSpec(
        "MC-Dropout", "mc-dropout-trained", "single", {"p": DROPOUT, "n_members": MC_SAMPLES}
    ),
    MethodSpec("EMP", "emp", "single", {**PATCHED, "n_members": MC_SAMPLES}),
    MethodSpec("ECMP", "ecmp", "single", {**PATCHED, "n_members": MC_SAMPLES}),
    MethodSpec("Packed-(2,4,1)", "packed", "single", {"alpha": 2, "num_estimators": 4, "gamma": 1}),
    MethodSpec("PEP-10", "pep", "single", {"n_members": 10}),
    MethodSpec("PEG-10", "peg", "single", {"n_members": 10, "grad_batch_size": _peg_batch}),
)
METHODS = tuple(m.name for m in SPECS)
BY_NAME = {m.name: m for m in SPECS}
# checkpoint names of the models the methods train (kept from the first runs' caches)
CHECKPOINTS = {"MC-Dropout": "mc-dropout", "Packed-(2,4,1)": "packed"}


def _recipe(name: str, epochs: int | None) -> Recipe:
    n = epochs if epochs is not None else EPOCHS.get(name, 40)
    return Recipe(epochs=n, lr=0.01, optimizer="adam", weight_decay=0.0, batch_size=32)


class Split:
    """One (data set, split): standardised data, the trained models, cached test outputs."""

    def __init__(self, name: str, k: int, cache: Path, epochs: int | None, root: Any) -> None:
        self.name, self.k = name, k
        self.cache = cache / name / f"split-{k}"
        X, y = datasets.load(f"uci-{name}", "train", root=root, split_index=k)
        Xt, yt = datasets.load(f"uci-{name}", "test", root=root, split_index=k)
        X, y, Xt, yt, self.stats = uci_normalise(X, y, Xt, yt)
        perm = torch.randperm(len(X), generator=torch.Generator().manual_seed(k))
        n_val = max(1, len(X) // 10)
        fit, val = perm[n_val:], perm[:n_val]
        self.train = (X[fit].float(), y[fit].float())
        self.val = (X[val].float(), y[val].float())
        self.test = (Xt.float(), yt.float())
        self.recipe = _recipe(name, epochs)
        self.hidden = HIDDEN.get(name, 50)

    def factory(self, dropout: float = 0.0) -> Callable[[], nn.Module]:
        D = self.train[0].shape[1]
        return lambda: RegressionMLP(D, hidden=self.hidden, dropout=dropout)

    def model(self, packed: Any = None, dropout: float = 0.0) -> nn.Module:
        """A fresh network under the split's seed: the Gaussian MLP (with `dropout`), or with
        `packed` the same MLP packed (Gaussian heads)."""
        if packed is None:
            return instantiate(self.factory(dropout), self.k)
        D = self.train[0].shape[1]
        return instantiate(lambda: MLP(D, 2, hidden=(self.hidden,), packed=packed), self.k)

    def deep_ensemble(self) -> Ensemble:
        if not hasattr(self, "_deep"):
            self._deep = DeepEnsemble(
                n_members=5,
                recipe=self.recipe,
                seed=self.k,
                checkpoint_dir=self.cache / "deep-ensemble",
                progress=False,
                loss=gaussian_nll_loss,
            ).fit(self.factory(), self.train)
        return self._deep.ensemble()

    def single(self) -> nn.Module:
        return self.deep_ensemble().member_model(0)

    def _trained(
        self, tag: str, net: nn.Module, loss: Callable[[Tensor, Tensor], Tensor]
    ) -> nn.Module:
        train(
            net,
            self.train,
            self.recipe,
            seed=self.k,
            loss=loss,
            checkpoint=self.cache / f"{tag}.safetensors",
            progress=False,
        )
        return net

    def site(self, method: MethodSpec) -> registry.Site:
        """Where `method` is built: the single model or the deep ensemble as base, the Gaussian
        NLL as loss, and the split's recipe for the models the methods train."""
        bases = {"single": self.single, "deepens-5": self.deep_ensemble}
        tag = CHECKPOINTS.get(method.name, method.name)
        return registry.Site(
            seed=self.k,
            progress=False,
            base=bases[method.base],
            val=self.val,
            train=self.train,
            model=self.model,
            fit_model=lambda net, loss: self._trained(tag, net, loss),
            loss=gaussian_nll_loss,
            packed_loss=packed_gaussian_nll,
        )

    def build(self, method: str) -> Any:
        """A fitted predictor with `member_logits(X) -> [M, N, 2]` (or an nn.Module)."""
        spec = BY_NAME[method]
        options = {k: v(self) if callable(v) else v for k, v in spec.options.items()}
        return registry.build(spec.method, self.site(spec), **options)

    def outputs(self, method: str) -> Tensor:
        """Test outputs `[M, N, 2]` (cached)."""
        path = self.cache / "outputs" / f"{method}.safetensors"
        if path.exists():
            return load_tree(path)["outputs"]
        out = member_logits_of(self.build(method), self.test[0])
        save_tree(path, {"outputs": out})
        return out

    def scores(self, method: str) -> dict[str, float]:
        mean, var = split_gaussian(self.outputs(method))
        y, scale = self.test[1], float(self.stats.y_std)
        # standardised targets: RMSE × std and LPD − log std give the data's units
        return {"rmse": rmse(mean, y, scale), "lpd": log_predictive_density(mean, var, y, scale)}


def _se(values: list[float]) -> dict[str, Any]:
    """Mean, std and standard error over splits. A split whose score is not finite (an LPD of
    -inf: some test point has zero density under every member) makes the mean infinite; it is
    then written as None (JSON null) with the count of such splits, not averaged away."""
    n = len(values)
    nonfinite = sum(not math.isfinite(v) for v in values)
    if nonfinite:
        return {"mean": None, "std": None, "se": None, "n": n, "nonfinite": nonfinite}
    sd = statistics.stdev(values) if n > 1 else 0.0
    return {"mean": statistics.fmean(values), "std": sd, "se": sd / math.sqrt(n), "n": n}


def _names(given: Any, what: str, known: Sequence[str]) -> list[str]:
    """`given` as a list of names among `known`; a ValueError naming `what` otherwise (a YAML
    spec's `uci:` block is untrusted: a string, a number or nested lists are refused)."""
    if not isinstance(given, (list, tuple)) or not all(isinstance(g, str) for g in given):
        raise ValueError(f"{what}: expected a list of names among {list(known)}, got {given!r}")
    unknown = [g for g in given if g not in known]
    if unknown:
        raise ValueError(f"{what}: unknown {unknown}; known: {list(known)}")
    return list(given)


def run_uci(
    sets: Sequence[str] | None = None,
    splits: int | None = None,
    methods: Sequence[str] = METHODS,
    epochs: int | None = None,
    out: str | Path = "results",
    cache: str | Path = ".peg-cache/bench",
    root: Any = None,
    progress: bool | None = None,
    command: str | None = None,
    say: Callable[[str], None] = print,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run the benchmark; write `results/uci/results.{json,md}`; return the results. `out/uci`
    is refused before any work where it is a non-empty folder peg bench did not make, unless
    `overwrite` (`peg.apps.bench.folders`).

    Args:
        sets: UCI names (default: all nine); splits: use the first `splits` standard splits of
            each set (default: all); epochs: override every set's epochs (tests, smoke runs).
    """
    sets = list(UCI_SETS) if sets is None else _names(sets, "sets", UCI_SETS)
    methods = _names(methods, "methods", METHODS)
    for name, value in (("splits", splits), ("epochs", epochs)):  # a spec's uci: block
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    claim_bench(out, "uci", overwrite, files=())
    started = time.perf_counter()
    per: dict[str, dict[str, dict[str, list[float]]]] = {}
    for name in sets:
        n = uci_n_splits(name, root) if splits is None else min(splits, uci_n_splits(name, root))
        for k in bar(range(n), f"uci {name}", n, progress):
            one = Split(name, k, Path(cache) / "uci", epochs, root)
            for method in methods:
                for metric, value in one.scores(method).items():
                    per.setdefault(name, {}).setdefault(method, {}).setdefault(metric, [])
                    per[name][method][metric].append(value)
        say(f"uci {name}: {n} splits done")
    results = {
        "command": command or "peg bench uci",
        "commit": git_commit(),
        "machine": machine(),
        "wall_seconds": time.perf_counter() - started,
        "datasets": {
            d: {m: {k: _se(v) for k, v in cell.items()} for m, cell in ms.items()}
            for d, ms in per.items()
        },
    }
    text = _report(results, list(methods))
    write_results(Path(out) / "uci", results, text)
    say(text)
    return results


def _report(results: dict[str, Any], methods: list[str]) -> str:
    lines = [
        "# UCI regression",
        "",
        f"Command: `{results['command']}`; commit {results['commit']}; machine: "
        f"{results['machine']}; wall time {results['wall_seconds']:.0f} s. Mean ± standard "
        "error over splits, in the data's units.",
        "",
    ]
    orders = (("rmse", "RMSE (lower is better)", min), ("lpd", "LPD (higher is better)", max))
    for metric, title, best in orders:
        lines += [f"## {title}", "", "| data set | splits | " + " | ".join(methods) + " |"]
        lines.append("|---|---:|" + "---:|" * len(methods))
        for d, ms in results["datasets"].items():
            means = [ms[m][metric]["mean"] for m in methods]
            top = best((v for v in means if v is not None), default=None)
            cells = []
            for m in methods:
                c = ms[m][metric]
                if c["mean"] is None:  # see _se
                    cells.append(f"−∞ ({c['nonfinite']} of {c['n']} splits)")
                    continue
                text = f"{c['mean']:.3f} ± {c['se']:.3f}"
                cells.append(f"**{text}**" if c["mean"] == top else text)
            n = ms[methods[0]][metric]["n"]
            lines.append(f"| {d} | {n} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)
