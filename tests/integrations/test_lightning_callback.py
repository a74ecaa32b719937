"""`peg.integrations.lightning.CalibrationCallback` in real `lightning.Trainer` runs (CPU, tiny
model and data): the calibrator fitted on the validation logits equals one fitted on those
logits directly, the metrics reach the loggers, the figure only where a logger takes figures."""

from __future__ import annotations

import csv
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import peg

L = pytest.importorskip("lightning")
from lightning.pytorch.loggers import CSVLogger, Logger  # noqa: E402

from peg.integrations.lightning import CalibrationCallback  # noqa: E402

from conftest import moons  # noqa: E402


class Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


class FigureLogger(Logger):
    """A logger whose experiment has `add_figure` (as TensorBoard's), recording the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[dict[str, float]] = []
        self.figures: list[tuple[str, object, int]] = []

    @property
    def name(self) -> str:
        return "figures"

    @property
    def version(self) -> int:
        return 0

    @property
    def experiment(self) -> FigureLogger:
        return self

    def add_figure(self, tag, figure, global_step=None) -> None:
        self.figures.append((tag, figure, global_step))

    def log_metrics(self, metrics, step=None) -> None:
        self.metrics.append(dict(metrics))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


def _loaders():
    X, y = moons(256, seed=0)
    Xv, yv = moons(200, seed=1)
    train = DataLoader(TensorDataset(X, y), batch_size=32, shuffle=True)
    val = DataLoader(TensorDataset(Xv, yv), batch_size=64)
    return train, val, (Xv, yv)


def _trainer(callback, logger=False, **kw):
    return L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=logger,
        callbacks=[callback],
        num_sanity_val_steps=0,
        **kw,
    )


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="lightning")
        warnings.filterwarnings("ignore", category=UserWarning, message=".*num_workers.*")
        yield


def test_fit_end_calibrates_on_the_validation_logits(tmp_path):
    torch.manual_seed(0)
    train, val, (Xv, yv) = _loaders()
    callback = CalibrationCallback("TS", conformal=0.2)
    module = Module()
    logger = FigureLogger()
    _trainer(callback, logger=[CSVLogger(tmp_path), logger]).fit(module, train, val)
    assert module.training  # as Lightning leaves it: the callback's eval pass restored the mode

    with torch.no_grad():
        logits = module.eval()(Xv)
    expected = peg.TemperatureScaling().fit(nn.Identity(), (logits, yv))
    assert callback.calibrator_.temperature_ == pytest.approx(expected.temperature_, rel=1e-5)
    torch.testing.assert_close(
        callback.calibrator_.predict_proba(logits), expected.predict_proba(logits)
    )
    sets = peg.ConformalClassifier(alpha=0.2).fit(nn.Identity(), (logits, yv))
    assert callback.conformal_.quantile_ == pytest.approx(sets.quantile_, rel=1e-5)
    metrics = callback.metrics_
    assert metrics["calibration/nll_before"] == pytest.approx(peg.metrics.nll(logits[None], yv))
    assert metrics["calibration/nll_after"] <= metrics["calibration/nll_before"] + 1e-9
    assert set(metrics) == {f"calibration/{m}_{w}" for m in ("accuracy", "nll", "ece", "brier")
                            for w in ("before", "after")}  # fmt: skip
    # after fit: every logger's log_metrics (LightningModule.log is refused in on_fit_end)
    assert logger.metrics[-1] == metrics
    with open(next(tmp_path.rglob("metrics.csv"))) as f:
        last = list(csv.DictReader(f))[-1]
    assert float(last["calibration/ece_after"]) == pytest.approx(metrics["calibration/ece_after"])
    # the figure went to the logger that has add_figure, the CSV logger took none (no error)
    ((tag, figure, step),) = logger.figures
    assert tag == "calibration/reliability" and step == 2 * len(train)
    assert len(figure.axes) >= 1


def test_validation_end_logs_through_the_module_every_epoch():
    torch.manual_seed(0)
    train, val, _ = _loaders()
    callback = CalibrationCallback(
        peg.VectorScaling(), when="validation_end", prefix="cal/", log_figure=False
    )
    logger = FigureLogger()
    trainer = _trainer(callback, logger=logger)
    trainer.fit(Module(), train, val)
    assert isinstance(callback.calibrator_, peg.VectorScaling) and callback.conformal_ is None
    logged = [m for m in logger.metrics if "cal/nll_after" in m]
    assert len(logged) == 2  # one per validation epoch, through LightningModule.log_dict
    assert trainer.callback_metrics["cal/ece_before"].item() == pytest.approx(
        callback.metrics_["cal/ece_before"], rel=1e-6
    )
    assert logger.figures == []


@pytest.mark.filterwarnings("ignore:temperature scaling")  # an untrained model: T at a bound
def test_validate_under_inference_mode_fits_too():
    """`trainer.validate` runs under torch.inference_mode: the fit needs autograd outside it."""
    _, val, _ = _loaders()
    callback = CalibrationCallback("TS", when="validation_end")
    _trainer(callback).validate(Module(), val)
    assert callback.calibrator_.temperature_ > 0


@pytest.mark.parametrize(
    ("kwargs", "with_val", "match"),
    [({}, False, "val_dataloaders"), ({"dataloader_idx": 1}, True, "dataloader_idx: 1 is beyond")],
)
def test_no_validation_data_to_calibrate_on_is_refused_before_training(kwargs, with_val, match):
    train, val, _ = _loaders()
    trainer = _trainer(CalibrationCallback(**kwargs))
    with pytest.raises(ValueError, match=match):
        trainer.fit(Module(), train, val if with_val else None)
    assert trainer.global_step == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"calibrator": "tempscaling"}, "calibrator"),
        ({"calibrator": peg.ConformalClassifier()}, "conformal="),
        ({"conformal": 1.5}, "conformal"),
        ({"conformal": "0.1"}, "conformal"),
        ({"conformal": peg.ConformalClassifier(shift="label")}, "conformal"),
        ({"when": "test_end"}, "when"),
        ({"bins": 0}, "bins"),
        ({"dataloader_idx": -1}, "dataloader_idx"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, match):
    with pytest.raises(peg.InvalidParameterError, match=match):
        CalibrationCallback(**kwargs)


def test_the_callback_is_a_lightning_callback():
    """What Lightning's Trainer accepts; `import peg` itself loads no Lightning
    (tests/test_imports.py)."""
    assert isinstance(CalibrationCallback(), L.Callback)


def test_monitors_read_the_calibration_metrics_without_a_logger(tmp_path):
    """With logger=False only val_loss reached trainer.callback_metrics: logged through the
    module at each validation end, ModelCheckpoint and EarlyStopping read them."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    torch.manual_seed(0)
    train, val, _ = _loaders()
    callback = CalibrationCallback("TS", when="validation_end", log_figure=False)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="calibration/ece_after", mode="min")
    stopping = EarlyStopping(monitor="calibration/nll_after", patience=10)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", enable_progress_bar=False,
                        enable_model_summary=False, logger=False, num_sanity_val_steps=0,
                        callbacks=[checkpoint, stopping, callback])  # fmt: skip
    trainer.fit(Module(), train, val)
    assert trainer.callback_metrics["calibration/ece_after"].item() == pytest.approx(
        callback.metrics_["calibration/ece_after"], rel=1e-6
    )
    assert checkpoint.best_model_path and checkpoint.best_model_score is not None
    assert stopping.best_score.item() <= callback.metrics_["calibration/nll_after"] + 1e-6


def test_after_fit_the_metrics_are_in_callback_metrics_too():
    torch.manual_seed(0)
    train, val, _ = _loaders()
    callback = CalibrationCallback("TS", log_figure=False)
    trainer = _trainer(callback)  # logger=False
    trainer.fit(Module(), train, val)
    for key, value in callback.metrics_.items():
        assert trainer.callback_metrics[key].item() == pytest.approx(value, rel=1e-6)


def test_monitoring_the_metrics_of_a_fit_end_callback_is_refused_before_training(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    train, val, _ = _loaders()
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="calibration/ece_after")
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", enable_progress_bar=False,
                        logger=False, callbacks=[checkpoint, CalibrationCallback()])  # fmt: skip
    with pytest.raises(ValueError, match="when='validation_end'"):
        trainer.fit(Module(), train, val)
    assert trainer.global_step == 0
