"""`benchmarks/scale_search.py --table`: the default search against the exhaustive one
(issue 38's, `ScaleSearch(exact_points=1024, first_points=1024, scorings=3)`) on the bases of
`_scale_bases` (a CIFAR-10 CNN, transformers' ResNet, ViT and BERT from small configs, the UCI
regression base), per base × validation points × seed, with the bar and the fit cost × TS.

One PEG-15 fit per (base, n, seed): its gradient steps are computed once, and every search
setting runs on the same members and scoring points (`SearchRun` replaced, for the fit, by one
that runs each setting in turn and records its choice and its CPU seconds); the fit's cost for
a setting is the fit's CPU seconds less the first setting's search plus its own. Each fit's
record (the settings' scales, points and seconds, the test losses at every scale chosen) is
cached under .peg-cache/scale-search/table/, so a rerun resumes; a setting is keyed by its
name and `--tag` (a library change that moves a setting's choice gets a new tag).

The measure: the chosen η's test NLL (mean per-point loss; the regression base: the members'
mixture NLL) minus the exhaustive search's, per seed, against the bar max(0.002 nats, 5% of
PEG's gain over the base) with the gain of the exhaustive search's choice at that seed.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import torch
from _bases import CACHE
from _scale_bases import BASES
from torch import Tensor

from peg.methods.calibration.temperature import TemperatureScaling
from peg.methods.perturbation import _perturb
from peg.methods.perturbation._criteria import POINT_LOSSES
from peg.methods.perturbation._scale_search import ScaleSearch, SearchRun
from peg.methods.perturbation.peg import PEG
from peg.metrics.regression import split_gaussian

EXHAUSTIVE = "exhaustive"
SETTINGS: dict[str, dict[str, Any]] = {
    EXHAUSTIVE: {"exact_points": 1024, "first_points": 1024, "scorings": 3},
    "default": {},
}
TEST_POINTS = 2000


def setting(token: str) -> ScaleSearch:
    """A setting by name: "exhaustive", "default", a `ScaleSearch` preset name, or
    "key=value,..." options."""
    if token in SETTINGS:
        return ScaleSearch(**SETTINGS[token])
    if hasattr(ScaleSearch, token):
        return getattr(ScaleSearch, token)()
    options = dict(item.split("=", 1) for item in token.split(","))
    return ScaleSearch(
        **{k: (float if "." in v or "e-" in v else int)(v) for k, v in options.items()}
    )


def point_losses(outputs: Tensor, y: Tensor, regression: bool) -> Tensor:
    """Per-point test losses `[N]` (float64): NLL of the mean probability; mixture NLL."""
    if not regression:
        return POINT_LOSSES["nll"](outputs.double(), y)
    mean, var = split_gaussian(outputs.double())
    log_p = torch.distributions.Normal(mean, var.sqrt()).log_prob(y.double())  # [M, N]
    return -(torch.logsumexp(log_p, 0) - math.log(len(outputs)))


class _Runs:
    """Replaces `SearchRun` during one fit: runs every setting on the same target."""

    def __init__(self, settings: dict[str, ScaleSearch]) -> None:
        self.settings, self.record = settings, {}

    def __call__(self, target: Any, y: Tensor, options: ScaleSearch, **kw: Any) -> Any:
        outer = self

        class Many:
            scores: dict[float, float]

            def run(self, grid: Any, refine: bool) -> float:
                first = None
                for name, made in outer.settings.items():
                    start = time.process_time()
                    one = SearchRun(target, y, made, **kw)
                    scale = one.run(grid, refine)
                    outer.record[name] = {
                        "scale": scale,
                        "points": [[s, one.points.get(s, 0)] for s in one.scores],
                        "scores": [[s, v] for s, v in one.scores.items()],
                        "seconds": time.process_time() - start,
                    }
                    if first is None:
                        first = one
                assert first is not None
                self.scores, self.points = first.scores, first.points
                self.stopped, self.predicted = first.stopped, first.predicted
                return outer.record[next(iter(outer.settings))]["scale"]

        return Many()


def record_key(token: str, tag: str) -> str:
    """A setting's key in a record: "exhaustive", "<token>@<tag>", or the token when it names
    its tag ("default@i49": issue 49's default, run at that library state)."""
    return token if token == EXHAUSTIVE or "@" in token else f"{token}@{tag}"


def fit_record(
    name: str, n: int, seed: int, tokens: list[str], tag: str, cached_only: bool = False
) -> dict[str, Any]:
    """The record of one (base, n, seed): per setting its scale, points, CPU seconds; the test
    losses at every scale chosen; the base's test loss; TS's fit CPU seconds."""
    path = CACHE / "scale-search" / "table" / f"{name}-{n}-{seed}.json"
    record = json.loads(path.read_text()) if path.exists() else {"settings": {}, "test": {}}
    keys = {t: record_key(t, tag) for t in tokens}
    missing = [t for t in tokens if keys[t] not in record["settings"]]
    if not missing or cached_only:
        return record
    base, val, test, regression = BASES[name]()
    val = (val[0][:n], val[1][:n])
    test = (test[0][:TEST_POINTS], test[1][:TEST_POINTS])
    if "base" not in record:
        with torch.no_grad():
            out = base(test[0])
        record["base"] = float(point_losses(out[None], test[1], regression).mean())
        if not regression:
            start = time.process_time()
            TemperatureScaling().fit(base, val)
            record["ts_seconds"] = time.process_time() - start
    runs = _Runs({t: setting(t.split("@")[0]) for t in missing})
    original = _perturb.SearchRun
    _perturb.SearchRun = runs  # type: ignore[assignment,misc]
    try:
        start = time.process_time()
        fitted = PEG(n_members=15, seed=seed, progress=False, search=ScaleSearch()).fit(base, val)
        fit_seconds = time.process_time() - start
    finally:
        _perturb.SearchRun = original  # type: ignore[misc]
    first = runs.record[missing[0]]["seconds"]
    for t in missing:
        entry = runs.record[t]
        entry["fit_seconds"] = fit_seconds - first + entry["seconds"]
        key = f"{entry['scale']:.9g}"
        if key not in record["test"]:
            out = fitted.ensemble_at(entry["scale"]).member_logits(test[0], 256, progress=False)
            record["test"][key] = point_losses(out, test[1], regression).tolist()
        record["settings"][keys[t]] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return record


def _cost(entry: dict[str, Any], ts: float) -> str:
    """A fit's CPU seconds × TS's (the regression base, without TS: in seconds)."""
    if math.isfinite(ts):
        return f"{entry['fit_seconds'] / ts:5.1f} × TS"
    return f"{entry['fit_seconds']:5.2f} CPU s"


def table_main(
    cases: list[str], seeds: list[int], tokens: list[str], tag: str, cached_only: bool = False
) -> None:
    """Print per (base, n, seed) every setting's η, points, test NLL − exhaustive's, the bar,
    and fit CPU seconds × TS's; then the largest difference per setting (`cached_only`: the
    records as cached, a setting not run shown as such, nothing fitted)."""
    tokens = [EXHAUSTIVE] + [t for t in tokens if t != EXHAUSTIVE]
    worst: dict[str, float] = {t: -math.inf for t in tokens[1:]}
    for case in cases:
        name, n = case.rsplit("-", 1)
        for seed in seeds:
            record = fit_record(name, int(n), seed, tokens, tag, cached_only)
            if EXHAUSTIVE not in record["settings"]:
                continue
            ex = record["settings"][EXHAUSTIVE]
            ex_loss = torch.tensor(record["test"][f"{ex['scale']:.9g}"])
            gain = record["base"] - float(ex_loss.mean())
            bar = max(0.002, 0.05 * gain)
            ts = record.get("ts_seconds", math.nan)
            total = sum(k for _, k in ex["points"])
            print(f"{case} seed {seed}: base {record['base']:.4f}, exhaustive η {ex['scale']:.3g} "
                  f"scored {len(ex['points'])} (Σ {total}) test {float(ex_loss.mean()):.4f} "
                  f"(gain {gain:+.4f}, bar {bar:.4f}), fit {_cost(ex, ts)}")  # fmt: skip
            for t in tokens[1:]:
                if record_key(t, tag) not in record["settings"]:
                    print(f"  {t:>28}: not run")
                    continue
                entry = record["settings"][record_key(t, tag)]
                loss = torch.tensor(record["test"][f"{entry['scale']:.9g}"])
                d = loss - ex_loss
                diff, se = float(d.mean()), float(d.std()) / math.sqrt(len(d))
                worst[t] = max(worst[t], diff - bar)
                points = "/".join(str(k) for _, k in entry["points"])
                points += f" (Σ {sum(k for _, k in entry['points'])})"
                print(f"  {t:>28}: η {entry['scale']:9.3g} scored {len(entry['points'])} on "
                      f"{points:22} test {float(loss.mean()):.4f}  − exhaustive {diff:+.4f} "
                      f"(SE {se:.4f}) {'within' if diff <= bar else 'OUTSIDE'}  fit "
                      f"{_cost(entry, ts)}")  # fmt: skip
    for t, w in worst.items():
        print(f"# {t}: largest (default − exhaustive) − bar over the cases: {w:+.4f} "
              f"({'every case within its bar' if w <= 0 else 'OUTSIDE on some case'})")  # fmt: skip
