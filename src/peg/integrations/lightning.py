"""A Lightning callback that calibrates the model it trains: `CalibrationCallback`.

    from peg.integrations.lightning import CalibrationCallback

    calibration = CalibrationCallback("TS", conformal=0.1)
    trainer = lightning.Trainer(max_epochs=10, callbacks=[calibration])
    trainer.fit(module, train_loader, val_loader)
    calibration.calibrator_.predict_proba(logits)     # the fitted map, on logits [N, C]
    calibration.conformal_.predict_set(logits)        # sets holding the label w.p. >= 0.9
    calibration.metrics_                              # {"calibration/nll_before": ..., ...}

Needs `lightning` (`pip install "peg[lightning]"`), or the standalone `pytorch_lightning`;
imported only by this module, never by `import peg`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from peg.integrations._common import (
    DEFAULT_CALIBRATOR,
    Calibration,
    check_calibrator,
    check_conformal,
    figure_sink,
    fit_calibration,
    gather,
    reliability_figure,
)
from peg.methods import _constraints as checks
from peg.methods.base import Params, store_arguments
from peg.methods.calibration._calibrator import Calibrator
from peg.methods.conformal.classifier import ConformalClassifier
from peg.source.batches import BatchFn, call_model

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package, before `lightning` took its name
    try:
        from pytorch_lightning import Callback
    except ImportError:
        raise ImportError(
            "peg.integrations.lightning needs Lightning: pip install 'peg[lightning]' "
            "(or lightning, or pytorch_lightning)"
        ) from None

__all__ = ["CalibrationCallback"]


class CalibrationCallback(Params, Callback):
    """Fit a calibrator (and a conformal predictor) on the validation logits of the model a
    Lightning `Trainer` trains, and log how calibrated it was before and after.

    Args:
        calibrator: "TS" (temperature scaling) or another calibrator's archive name
            ("vector-scaling", "dirichlet", "isotonic", ...), or a peg calibrator instance
            whose arguments are used (a fresh copy is fitted each time; yours is left as it is).
        conformal: None, a miscoverage level α (a `peg.ConformalClassifier(alpha=α)`), or a
            `ConformalClassifier` to copy: fitted on the same logits, on the model's own
            probabilities (the calibrator was fitted on these points: the guarantee stays exact).
        when: "fit_end" (once, after `trainer.fit`) or "validation_end" (at the end of every
            validation epoch, sanity checks aside; also under `trainer.validate`).
        dataloader_idx: which validation dataloader, where there are several.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for batches that are neither `(x, y, ...)`
            nor a mapping with "labels" (`peg.source.batches`).
        bins: the bins of the ECE and of the reliability diagram.
        prefix: the logged metrics' prefix: `{prefix}nll_before`, `{prefix}ece_after`, ...
        log_figure: log the reliability diagrams before and after, to every logger whose
            experiment has `add_figure` (TensorBoard's); other loggers get the numbers only.

    The validation dataloader is read once more, whole (whatever `limit_val_batches`), by the
    module's forward in eval mode under the trainer's precision; logits `[N, C]` (`[N, T, C]`
    with labels `[N, T]`, rows labelled -100 left out) are gathered on the CPU batch by batch.
    One process only: under a multi-process strategy `setup` refuses (gather the logits yourself
    and fit `peg.TemperatureScaling().fit(nn.Identity(), (logits, labels))`).

    After the fit: `calibrator_` (fitted on `nn.Identity()`: it applies to logits), `conformal_`
    (or None), `metrics_` (accuracy, nll, ece, brier, each `_before` and `_after`, logged through
    `LightningModule.log_dict` at a validation end, so that they reach
    `trainer.callback_metrics` and `ModelCheckpoint` / `EarlyStopping` can monitor them; after
    `fit`, where Lightning allows no `log`, through every logger's `log_metrics` and put into
    `trainer.callback_metrics`; a callback monitoring them with `when="fit_end"` is refused
    before training: it reads them at validation ends). No `state_dict`: what the callback
    holds is refitted before it is used, in a resumed run too; keep a fitted calibrator with
    its own `save`.
    """

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "calibrator": checks.described(check_calibrator, "a calibrator's name or instance"),
        "conformal": checks.described(check_conformal, "None, α in (0, 1) or a conformal"),
        "when": checks.one_of("fit_end", "validation_end"),
        "dataloader_idx": checks.positive_int(minimum=0),
        "batch_fn": checks.batch_fn,
        "bins": checks.positive_int(),
        "prefix": checks.text("a metric-name prefix"),
        "log_figure": checks.boolean(),
    }

    def __init__(
        self,
        calibrator: str | Calibrator = DEFAULT_CALIBRATOR,
        *,
        conformal: float | ConformalClassifier | None = None,
        when: str = "fit_end",
        dataloader_idx: int = 0,
        batch_fn: BatchFn | None = None,
        bins: int = 15,
        prefix: str = "calibration/",
        log_figure: bool = True,
    ) -> None:
        store_arguments(self, locals())
        self.calibrator_: Calibrator | None = None
        self.conformal_: ConformalClassifier | None = None
        self.metrics_: dict[str, float] = {}

    # ---------------------------------------------------------------- hooks
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # the stages that calibrate (test and predict never do)
        if stage in ("fit", "validate") and int(getattr(trainer, "world_size", 1)) > 1:
            raise RuntimeError(
                f"CalibrationCallback: runs in one process; this trainer has world_size="
                f"{trainer.world_size}. Fit the calibrator after training, on the logits of "
                "the whole validation set: peg.TemperatureScaling().fit(nn.Identity(), "
                "(logits, labels))"
            )

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._loader(trainer)  # no validation data, or not that many loaders: said before training
        if self.when == "fit_end":
            self._check_monitors(trainer)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.when != "validation_end" or trainer.sanity_checking:
            return
        fit = self._calibrate(trainer, pl_module)
        pl_module.log_dict(self.metrics_, on_epoch=True, logger=True)
        self._log_figure(trainer, fit)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.when != "fit_end":
            return
        fit = self._calibrate(trainer, pl_module)
        for logger in trainer.loggers:  # `LightningModule.log` is refused in on_fit_end
            logger.log_metrics(self.metrics_, step=trainer.global_step)
        # where `log` would have put them, as tensors: read after fit, with or without loggers
        trainer.callback_metrics.update(
            {k: torch.tensor(v, dtype=torch.float32) for k, v in self.metrics_.items()}
        )
        self._log_figure(trainer, fit)

    # ---------------------------------------------------------------- work
    def _check_monitors(self, trainer: Any) -> None:
        """A callback monitoring one of this callback's metrics (`ModelCheckpoint`,
        `EarlyStopping`: their `monitor`) reads it at validation ends, where `fit_end` logs
        nothing: refused before training, not after the first epoch."""
        for other in trainer.callbacks:
            monitor = getattr(other, "monitor", None)
            if isinstance(monitor, str) and monitor.startswith(self.prefix):
                raise ValueError(
                    f"when: {type(other).__name__}(monitor={monitor!r}) reads the metric at "
                    "every validation end, and CalibrationCallback(when='fit_end') logs it "
                    "once, after fit; pass when='validation_end' (logged through "
                    "LightningModule.log_dict at each validation end)"
                )

    def _loader(self, trainer: Any) -> Any:
        loaders = trainer.val_dataloaders
        if loaders is None:
            raise ValueError(_NO_LOADER)
        if isinstance(loaders, Mapping):
            loaders = list(loaders.values())
        if not isinstance(loaders, (list, tuple)):
            loaders = [loaders]
        if self.dataloader_idx >= len(loaders):
            raise ValueError(
                f"dataloader_idx: {self.dataloader_idx} is beyond the trainer's "
                f"{len(loaders)} validation dataloader(s)"
            )
        return loaders[self.dataloader_idx]

    def _calibrate(self, trainer: Any, pl_module: Any) -> Calibration:
        precision = trainer.precision_plugin

        def forward(module: Any, x: Any) -> Any:
            with precision.forward_context():
                return call_model(module, precision.convert_input(x))

        loader = self._loader(trainer)
        logits, labels = gather(
            pl_module, loader, pl_module.device, self.batch_fn, "val_dataloaders", forward
        )
        fit = fit_calibration(self.calibrator, self.conformal, logits, labels, self.bins)
        self.calibrator_, self.conformal_ = fit.calibrator, fit.conformal
        self.metrics_ = fit.metrics(self.prefix)
        return fit

    def _log_figure(self, trainer: Any, fit: Calibration) -> None:
        if not self.log_figure:
            return
        sinks = [s for s in (figure_sink(lg.experiment) for lg in trainer.loggers) if s]
        if not sinks:
            return
        title = f"reliability before / after {type(fit.calibrator).__name__}"
        fig = reliability_figure(fit.curves, title)
        for add in sinks:
            add(f"{self.prefix}reliability", fig, global_step=trainer.global_step)


_NO_LOADER = (
    "val_dataloaders: CalibrationCallback calibrates on the validation data, and this trainer "
    "has none; pass val_dataloaders to trainer.fit (or define val_dataloader)"
)
