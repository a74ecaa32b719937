"""Evidence for docs/shift.md: label shift, conformal prediction under shift, feature OOD scores,
on one seed of a bench preset (its base model and the calibrators' member logits cached by the
bench's own `SeedRun`, under `--cache`).

The test set is put in a random order first (the bench keeps the files' order, which is by
class for CIFAR-10), so that its halves are exchangeable.

1. Label shift (Alexandari et al. 2020's protocol): the test set is split in half; the first
   half (natural priors, labelled) is the source data the estimators and BCTS are fitted on,
   target sets of `--target-size` points are drawn with replacement from the second half with
   class priors q ~ Dirichlet(α·1). For each calibrated predictor of the preset (none, TS,
   vector, Dirichlet, PEG, PEG + TS) as the calibration step: EM (`calibrate=None`), EM after
   BCTS, BBSE; the L1 error of the priors against the target's label frequencies, and the
   NLL / accuracy of the predictor before and after reweighting, on the target points.
2. Conformal under shift: APS sets (α = 0.1) calibrated on the clean first half of the test
   set; the shifted sets' second half split into unlabelled target inputs (the first quarter)
   and evaluation points (the last quarter); split conformal beside weighted conformal on the
   base model's penultimate features and on its logits (or the refusal, when the weights are
   unbounded); and label-shift conformal on Dirichlet(1) resamples.
3. OOD: AUROC / FPR95 of max-softmax, entropy, energy and the Mahalanobis / k-NN detectors
   (fitted on 5000 validation points) of the base model, test set against the preset's OOD
   sets.

Run (from the repository root, one thread):
    OMP_NUM_THREADS=1 python benchmarks/after_deployment.py --preset fashion-mnist-adam
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import yaml

import peg
from peg.apps import presets
from peg.apps.bench.seed import SeedRun
from peg.apps.bench.spec import parse_spec
from peg.methods.conformal._base import CachedLogits
from peg.metrics import ood
from peg.utils.env import git_commit, machine

COLUMNS = ["Single", "Temp-scaled", "Vector-scaled", "Dirichlet", "PEG-15", "PEG-15 + TS"]


def _spec(preset: str, seed: int, columns: list[str]):
    raw = yaml.safe_load(presets.find(preset).read_text())
    raw |= {"name": f"{raw['name']}-after-deployment", "seeds": [seed], "methods": columns,
            "figures": ["Single"]}  # fmt: skip
    raw.pop("conformal", None)
    return parse_spec(raw, preset)


def _nll_acc(log_probs: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    lp = log_probs.double().log_softmax(-1)
    return float(-lp[torch.arange(len(y)), y].mean()), float((lp.argmax(-1) == y).double().mean())


def _order(n: int, seed: int) -> torch.Tensor:
    """A random order of the test set (the bench keeps its file order, by class for CIFAR-10):
    its halves are then exchangeable."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(1000 + seed))


def label_shift(logits: dict, y: torch.Tensor, args) -> list[dict]:
    order = _order(len(y), args.seed)
    y = y[order]
    n = len(y) // 2
    y_src, y_pool = y[:n], y[n:]
    classes = int(y.max()) + 1
    by_class = [torch.nonzero(y_pool == c)[:, 0] for c in range(classes)]
    rows = []
    for alpha in args.alphas:
        for draw in range(args.draws):
            rng = np.random.default_rng([args.seed, int(alpha * 1000), draw])
            q = rng.dirichlet(np.full(classes, alpha))
            q = q * np.array([len(b) > 0 for b in by_class])  # a class absent from the pool
            q = q / q.sum()
            labels = rng.choice(classes, size=args.target_size, p=q)
            idx = torch.tensor([int(rng.choice(by_class[c])) for c in labels])
            y_t = y_pool[idx]
            q_emp = torch.bincount(y_t, minlength=classes).double() / len(y_t)
            for col in args.columns:
                z = logits[col]["test"][:, order]
                src, tgt = z[:, :n].transpose(0, 1), z[:, n:][:, idx].transpose(0, 1)
                before = CachedLogits().member_logits(tgt)
                nll0, acc0 = _nll_acc(peg.metrics.ensemble_log_probs(before), y_t)
                for name, kw in [("EM", {"calibrate": None}), ("EM + BCTS", {}),
                                 ("BBSE", {"method": "bbse", "calibrate": None})]:  # fmt: skip
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        shift = peg.LabelShift(**kw).fit(CachedLogits(), (src, y_src), target=tgt)
                    nll1, acc1 = _nll_acc(shift.member_logits(tgt)[0], y_t)
                    rows.append({"alpha": alpha, "draw": draw, "column": col, "estimator": name,
                                 "prior_l1": float((shift.priors_ - q_emp).abs().sum()),
                                 "nll_before": nll0, "nll_after": nll1,
                                 "acc_before": acc0, "acc_after": acc1})  # fmt: skip
    return rows


def _coverage(sets: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    return float(sets[torch.arange(len(y)), y].float().mean()), float(sets.sum(1).float().mean())


def conformal(run: SeedRun, model, logits: dict, args) -> list[dict]:
    order = _order(len(run.test[1]), args.seed)
    X, y = run.test[0][order], run.test[1][order]
    n = len(y) // 2
    q = n + (len(y) - n) // 2
    calib = (X[:n], y[:n])
    rows = []
    sets_by_name = run.eval_sets()
    for name, make in sets_by_name.items():
        if name.endswith("(OOD)"):
            continue
        Xs = make()[order]
        target, X_eval, y_eval = Xs[n:q], Xs[q:], y[q:]
        split = peg.ConformalClassifier(alpha=0.1, score="aps").fit(model, calib)
        cov, size = _coverage(split.predict_set(X_eval), y_eval)
        rows.append({"set": name, "method": "split", "coverage": cov, "size": size})
        for features in ("penultimate", "logits"):
            cp = peg.ConformalClassifier(alpha=0.1, score="aps", shift="covariate",
                                         features=features)  # fmt: skip
            row = {"set": name, "method": f"weighted ({features})"}
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    cp.fit(model, calib, target=target)
                cov, size = _coverage(cp.predict_set(X_eval), y_eval)
                row |= {"coverage": cov, "size": size, "auroc": cp.domain_auroc_,
                        "n_eff": cp.n_eff_, "warned": bool(caught)}  # fmt: skip
            except ValueError as e:
                text = str(e)
                row |= {"refused": text.split(":")[1].strip()[:60],
                        "auroc": float(text.split("AUROC ")[1].split(",")[0]),
                        "n_eff": float(text.split("weights ")[1].split(" of")[0])}  # fmt: skip
            rows.append(row)
    # label shift: Dirichlet(1) resamples of the second half, the first half as calibration
    z = logits["Single"]["test"][:, order]
    src = (z[:, :n].transpose(0, 1), y[:n])
    classes = int(y.max()) + 1
    by_class = [torch.nonzero(y[n:] == c)[:, 0] + n for c in range(classes)]
    for draw in range(args.draws):
        rng = np.random.default_rng([args.seed, 7, draw])
        q = rng.dirichlet(np.ones(classes)) * np.array([len(b) > 0 for b in by_class])
        labels = rng.choice(classes, size=2 * args.target_size, p=q / q.sum())
        idx = torch.tensor([int(rng.choice(by_class[c])) for c in labels])
        unl, ev = idx[: args.target_size], idx[args.target_size :]
        tgt = z[:, unl].transpose(0, 1)
        for shift in (None, "label"):
            cp = peg.ConformalClassifier(alpha=0.1, score="aps", shift=shift)
            cp.fit(CachedLogits(), src, **({} if shift is None else {"target": tgt}))
            cov, size = _coverage(cp.predict_set(z[:, ev].transpose(0, 1)), y[ev])
            rows.append({"set": f"dirichlet-1 #{draw}", "method": shift or "split",
                         "coverage": cov, "size": size})  # fmt: skip
    return rows


def ood_rows(run: SeedRun, model, logits: dict) -> list[dict]:
    val = (run.val[0][:5000], run.val[1][:5000])
    dets = {s: peg.OODDetector(score=s).fit(model, val) for s in ("mahalanobis", "knn")}
    X_test = run.test[0]
    z_in = logits["Single"]["test"]
    rows = []
    for name, inputs in run.eval_sets().items():
        if not name.endswith("(OOD)"):
            continue
        z_out = logits["Single"][name]
        for score in ("max_softmax", "entropy", "energy"):
            m = ood.ood_metrics(z_in, z_out, score)
            rows.append({"ood": name, "score": score, "auroc": m["auroc"], "fpr95": m["fpr95"]})
        X_out = inputs()
        for score, det in dets.items():
            s_in, s_out = det.ood_score(X_test), det.ood_score(X_out)
            rows.append(
                {
                    "ood": name,
                    "score": f"{score} ({det.features_})",
                    "auroc": ood.auroc(s_in, s_out),
                    "fpr95": ood.fpr_at_tpr(s_in, s_out),
                }
            )
    return rows


def _ms(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
    a = np.asarray(values) * scale
    return f"{a.mean():.{digits}f} ± {a.std():.{digits}f}" if len(a) > 1 else f"{a[0]:.{digits}f}"


def render(out: dict, title: str) -> str:
    """The markdown report of one run's JSON."""
    lines = [f"# After deployment: {title}", "", f"Command: `{out['command']}`; commit "
             f"{out.get('commit')}; machine: {out['machine']}; {out['seconds']:.0f} s.",
             ""]  # fmt: skip
    rows = out.get("label_shift", [])
    for alpha in sorted({r["alpha"] for r in rows}):
        sub = [r for r in rows if r["alpha"] == alpha]
        draws = len({r["draw"] for r in sub})
        lines += [f"## Label shift, Dirichlet(α = {alpha:g}) priors ({draws} draws)", "",
                  "Prior error (L1) / NLL / accuracy % on the target points (mean ± std over "
                  "draws); *before*: the calibrated predictor as it is.", "",
                  "| calibration step | before: NLL / acc | EM | EM + BCTS | BBSE |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for col in dict.fromkeys(r["column"] for r in sub):
            cells = []
            for est in ("EM", "EM + BCTS", "BBSE"):
                e = [r for r in sub if r["column"] == col and r["estimator"] == est]
                cells.append(f"{_ms([r['prior_l1'] for r in e])} / "
                             f"{_ms([r['nll_after'] for r in e])} / "
                             f"{_ms([r['acc_after'] for r in e], 100, 1)}")  # fmt: skip
            e = [r for r in sub if r["column"] == col and r["estimator"] == "EM"]
            nll, acc = _ms([r["nll_before"] for r in e]), _ms([r["acc_before"] for r in e], 100, 1)
            before = f"{nll} / {acc}"
            lines.append(f"| {col} | {before} | {' | '.join(cells)} |")
        lines.append("")
    rows = out.get("conformal", [])
    if rows:
        methods = list(dict.fromkeys(r["method"] for r in rows if not r["set"].startswith("dir")))
        lines += ["## Conformal prediction under shift (APS, α = 0.1)", "",
                  "Coverage % / mean set size on the evaluation quarter; weighted: the domain "
                  "classifier's out-of-fold AUROC and the weights' effective sample size, or why "
                  "it was refused.", "",
                  "| set | " + " | ".join(methods) + " |",
                  "|---|" + "---|" * len(methods)]  # fmt: skip
        for name in dict.fromkeys(r["set"] for r in rows if not r["set"].startswith("dir")):
            cells = []
            for m in methods:
                r = next(r for r in rows if r["set"] == name and r["method"] == m)
                if "refused" in r:
                    cells.append(f"refused (AUROC {r['auroc']:.3f}, n_eff {r['n_eff']:.0f})")
                    continue
                cell = f"{100 * r['coverage']:.1f} / {r['size']:.2f}"
                if "auroc" in r:
                    warned = ", warned" if r["warned"] else ""
                    cell += f" (AUROC {r['auroc']:.2f}, n_eff {r['n_eff']:.0f}{warned})"
                cells.append(cell)
            lines.append(f"| {name} | {' | '.join(cells)} |")
        dirichlet = [r for r in rows if r["set"].startswith("dir")]
        if dirichlet:
            lines += ["", "Label shift (Dirichlet(1) resamples of the second half): coverage % "
                      "/ set size, split conformal → label-weighted (Podkopaev & Ramdas):",
                      ""]  # fmt: skip
            for name in dict.fromkeys(r["set"] for r in dirichlet):
                a, b = (next(r for r in dirichlet if r["set"] == name and r["method"] == m)
                        for m in ("split", "label"))  # fmt: skip
                lines.append(f"- {name}: {100 * a['coverage']:.1f} / {a['size']:.2f} → "
                             f"{100 * b['coverage']:.1f} / {b['size']:.2f}")  # fmt: skip
        lines.append("")
    rows = out.get("ood", [])
    if rows:
        sets = list(dict.fromkeys(r["ood"] for r in rows))
        lines += ["## OOD detection (the base model; test set against each OOD set)", "",
                  "AUROC % / FPR95 %.", "", "| score | " + " | ".join(sets) + " |",
                  "|---|" + "---|" * len(sets)]  # fmt: skip
        for score in dict.fromkeys(r["score"] for r in rows):
            cells = [next(f"{100 * r['auroc']:.1f} / {100 * r['fpr95']:.1f}" for r in rows
                          if r["score"] == score and r["ood"] == o) for o in sets]  # fmt: skip
            lines.append(f"| {score} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def summary(paths: list[Path]) -> str:
    """Label shift and conformal over several runs' JSON (seeds): means over seeds and draws."""
    runs = [json.loads(p.read_text()) for p in paths]
    rows = [r for run in runs for r in run.get("label_shift", [])]
    lines = [f"# After deployment: summary of {', '.join(p.stem for p in paths)}", "",
             *(f"- {p.stem}: `{run['command']}` (commit {run.get('commit')}, {run['machine']})"
               for p, run in zip(paths, runs, strict=True)), "",
             "## Label shift: prior error (L1) and NLL after adaptation, mean over seeds and "
             "draws (NLL before in the first column)", "",
             "| α | calibration step | NLL before | EM | EM + BCTS | BBSE |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for alpha in sorted({r["alpha"] for r in rows}):
        for col in dict.fromkeys(r["column"] for r in rows):
            sub = [r for r in rows if r["alpha"] == alpha and r["column"] == col]
            before = np.mean([r["nll_before"] for r in sub if r["estimator"] == "EM"])
            cells = []
            for est in ("EM", "EM + BCTS", "BBSE"):
                e = [r for r in sub if r["estimator"] == est]
                cells.append(f"{np.mean([r['prior_l1'] for r in e]):.3f} / "
                             f"{np.mean([r['nll_after'] for r in e]):.3f}")  # fmt: skip
            lines.append(f"| {alpha:g} | {col} | {before:.3f} | {' | '.join(cells)} |")
    rows = [r for run in runs for r in run.get("conformal", [])]
    lines += [
        "",
        "## Conformal (APS, α = 0.1): coverage % / set size, mean over seeds; "
        "refused: how many seeds refused",
        "",
        "| set | split | weighted (penultimate) | weighted (logits) |",
        "|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["set"] for r in rows if not r["set"].startswith("dir")):
        cells = []
        for m in ("split", "weighted (penultimate)", "weighted (logits)"):
            sub = [r for r in rows if r["set"] == name and r["method"] == m]
            done = [r for r in sub if "coverage" in r]
            cell = (f"{100 * np.mean([r['coverage'] for r in done]):.1f} / "
                    f"{np.mean([r['size'] for r in done]):.2f}") if done else "—"  # fmt: skip
            if len(done) < len(sub):
                cell += f" (refused {len(sub) - len(done)} of {len(sub)})"
            cells.append(cell)
        lines.append(f"| {name} | {' | '.join(cells)} |")
    dirichlet = [r for r in rows if r["set"].startswith("dir")]
    for m in ("split", "label"):
        cov = [100 * r["coverage"] for r in dirichlet if r["method"] == m]
        if cov:
            lines.append(
                f"\nDirichlet(1) label shift, {m}: coverage mean {np.mean(cov):.1f}, "
                f"min {min(cov):.1f}, max {max(cov):.1f} ({len(cov)} resamples)"
            )
    rows = [r for run in runs for r in run.get("ood", [])]
    sets = list(dict.fromkeys(r["ood"] for r in rows))
    lines += [
        "",
        "## OOD: AUROC % / FPR95 %, mean ± std over seeds",
        "",
        "| score | " + " | ".join(sets) + " |",
        "|---|" + "---|" * len(sets),
    ]
    for score in dict.fromkeys(r["score"] for r in rows):
        cells = []
        for o in sets:
            sub = [r for r in rows if r["score"] == score and r["ood"] == o]
            cells.append(f"{_ms([r['auroc'] for r in sub], 100, 1)} / "
                         f"{_ms([r['fpr95'] for r in sub], 100, 1)}")  # fmt: skip
        lines.append(f"| {score} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="fashion-mnist-adam")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache", default=".peg-cache/bench")
    p.add_argument("--out", default="results/after-deployment")
    p.add_argument("--alphas", type=float, nargs="+", default=[0.1, 1.0, 10.0])
    p.add_argument("--draws", type=int, default=5)
    p.add_argument("--target-size", type=int, default=1000)
    p.add_argument("--parts", nargs="+", default=["label", "conformal", "ood"])
    p.add_argument("--columns", nargs="+", default=COLUMNS, help="calibration steps, Single first")
    p.add_argument("--render", help="a run's JSON: write its markdown report beside it, only")
    p.add_argument("--summary", nargs="+", help="runs' JSON: write summary.md beside them, only")
    args = p.parse_args()
    if args.summary:
        paths = [Path(s) for s in args.summary]
        (paths[0].parent / "summary.md").write_text(summary(paths))
        return
    if args.render:
        path = Path(args.render)
        path.with_suffix(".md").write_text(render(json.loads(path.read_text()), path.stem))
        return
    started = time.time()
    spec = _spec(args.preset, args.seed, args.columns)
    run = SeedRun(spec, args.seed, Path(args.cache), progress=False)
    logits = {m.name: run.logits(m) for m in spec.methods}
    print(f"logits ready: {time.time() - started:.0f} s", flush=True)
    model = run.bases.get("single").eval()
    out = {"command": "OMP_NUM_THREADS=1 python benchmarks/after_deployment.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(args).items() if k not in ("render", "summary")),
        "machine": machine(), "commit": git_commit()}  # fmt: skip
    if "label" in args.parts:
        out["label_shift"] = label_shift(logits, run.test[1], args)
        print(f"label shift done: {time.time() - started:.0f} s", flush=True)
    if "conformal" in args.parts:
        out["conformal"] = conformal(run, model, logits, args)
        print(f"conformal done: {time.time() - started:.0f} s", flush=True)
    if "ood" in args.parts:
        out["ood"] = ood_rows(run, model, logits)
    out["seconds"] = time.time() - started
    path = Path(args.out) / f"{args.preset}-seed{args.seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    path.with_suffix(".md").write_text(render(out, path.stem))
    print(f"wrote {path} and its .md ({out['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
