"""Plain, seeded, resumable training loops with progress bars.

`train(model, data, Recipe(...))` trains in place and returns `(model, history)`. A `Recipe`
holds everything that defines a run except the model, data and seed, so training-time methods
(SWA, SWAG, Deep Ensembles) take one and record it. Schedules:

- ``"constant"``: the initial rate throughout.
- ``"cosine"``: cosine annealing to 0 over all steps.
- ``"swa"``: the SWA/SWAG papers' schedule (Izmailov et al. 2018, reference code): with
  t = epoch / swa_start, the rate is `lr` for t ≤ 0.5, decays linearly to `swa_lr` by t = 0.9,
  and stays there; from `swa_start` on, `torch.optim.swa_utils.SWALR` holds it at `swa_lr`.
  Like the reference, the rate changes once per epoch.

`callbacks` are called as `callback(epoch, model)` after every epoch (epoch counts from 1);
a callback with `state_dict()` / `load_state_dict()` is saved in the checkpoint with the model.
With `checkpoint=path`, the complete state (model, optimizer, schedulers, data-order generator,
global RNG for dropout, history, callbacks) is written atomically after every epoch; running
the same call again resumes from it and ends with the same weights as an uninterrupted run.

- `recipe`: `Recipe`, `make_optimizer`, the schedules (`swa_lr_factor`).
- `loop`: `train`, `check_training_data`, `instantiate`.
- `checkpoint`: the resumable run state (`load_checked`).
- `callbacks`: `Callback`, `Snapshots`, `EarlyStopping`.
"""

from peg.train.callbacks import Callback, EarlyStopping, Snapshots
from peg.train.checkpoint import CHECKPOINT_FORMAT, load_checked
from peg.train.loop import (
    CLASSIFICATION_LOSSES,
    ModelSource,
    check_training_data,
    instantiate,
    train,
)
from peg.train.recipe import Recipe, Schedule, make_optimizer, swa_lr_factor

__all__ = [
    "CHECKPOINT_FORMAT",
    "CLASSIFICATION_LOSSES",
    "Callback",
    "EarlyStopping",
    "ModelSource",
    "Recipe",
    "Schedule",
    "Snapshots",
    "check_training_data",
    "instantiate",
    "load_checked",
    "make_optimizer",
    "swa_lr_factor",
    "train",
]
