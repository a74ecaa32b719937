"""Validation and test logits of a CIFAR-10 CNN trained the way a `peg bench` preset trains its
`single` base (`benchmarks/many_classes.py`'s 10-class real row).

The preset's data (its training subset, its 10,000-image validation split, its 5,000-image test
subset, seed 0), its model and its recipe; only the epochs may be cut (`epochs`), in which case
the spec is renamed `<preset>-<epochs>ep` so its cache never mixes with the full preset's. The
model is member 0 of the preset's deep ensemble (`peg.apps.bench.bases.Bases` with one member:
member i's seed does not depend on the ensemble's size), checkpointed under `cache`, so a
rerun, or `peg bench <preset>` with the same cache, reuses it.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch
from torch import Tensor

from peg.apps.bench.bases import Bases
from peg.apps.bench.seed import SeedRun
from peg.apps.bench.spec import find_spec, load_specs
from peg.methods._predictors import member_logits_of


def preset_cnn_logits(
    preset: str = "cifar10-adam",
    epochs: int | None = None,
    cache: str | Path = ".peg-cache/bench",
    root: str | None = None,
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor], str]:
    """((val logits `[N_val, 10]`, labels), (test logits `[N_test, 10]`, labels), a line
    saying what was trained and how long it took). The validation points come in a seeded
    random order (the split keeps the archive's, sorted by class), the test points in theirs."""
    spec = load_specs(find_spec(preset))[0]
    if epochs is not None and epochs != spec.train.epochs:
        recipe = dataclasses.replace(spec.train, epochs=epochs)
        spec = dataclasses.replace(spec, name=f"{spec.name}-{epochs}ep", train=recipe)
    started = time.perf_counter()
    run = SeedRun(spec, 0, Path(cache), root, progress=False)
    run.bases = Bases(
        run.factory, run.train, spec.train, None, 0, 1, spec.swag_samples, run.cache, False, run.val
    )
    model = run.bases.get("single")
    trained = time.perf_counter() - started
    # the split keeps the archive's order (by class): a seeded shuffle makes any prefix of the
    # validation logits a random subset
    order = torch.randperm(len(run.val[1]), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        val = member_logits_of(model, run.val[0][order])[0].float()
        test = member_logits_of(model, run.test[0])[0].float()
    r = spec.train
    line = (
        f"{spec.name}: {spec.model} on {len(run.train[1])} CIFAR-10 training images, "
        f"{r.optimizer} lr {r.lr:g}, weight decay {r.weight_decay:g}, {r.schedule} schedule, "
        f"{r.epochs} epochs (the preset: {load_specs(find_spec(preset))[0].train.epochs}); "
        f"trained or loaded in {trained:.0f} s (cache {run.cache})"
    )
    return (val, run.val[1][order]), (test, run.test[1]), line
