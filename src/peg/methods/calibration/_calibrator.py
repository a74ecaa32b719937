"""The one mechanism every post-hoc calibrator shares (temperature, vector and matrix scaling,
Dirichlet calibration, histogram binning, isotonic regression, spline calibration, ensemble
temperature scaling, order-preserving scaling).

A calibrator is fitted on a predictor (an nn.Module, a `peg.Ensemble`, any fitted method) and
labelled validation data. `Calibrator.fit` reads the data once (`logits_and_labels`), turns the
member logits `[M, N, C]` into scores `[N, C]` (`scores_of`: log p̄, the log of the averaged
prediction, or the raw logits of a one-member predictor for the scalings that ask for them),
and hands them to the subclass's `_fit_map`; `scale` applies the fitted map (`_apply`) to the
predictor's logits, which `member_logits` / `iter_member_logits` / `predict_proba` go through.
`save` writes the predictor's ensemble with the map in the archive (`Archived`, in
`peg.methods.calibration._calibrator_archive`: its scalars in the meta's `"calibration"` entry,
its arrays beside the members), and every subclass is registered in
`peg.loading.CALIBRATORS` under its `method` name, so `peg.load` gives the fitted
calibrator back (`_restore`).

Every map records the number of classes C it was fitted on (`n_classes_`, saved as the entry's
`"n_classes"`) and refuses logits of another width (`scale`): a temperature fitted on 10 classes
applied to 5 columns, or a spline map to 8, is an error naming the argument and both counts,
not a prediction. Archives written before it carry no `"n_classes"`: C is then what the map's
arrays fix (`_classes_of`: vector scaling's bias, ...), or unknown (any width, as before).

A subclass sets `method` (the archive's and meta's name), `label` (for messages) and
implements `_fit_map(scores, y) -> state` (the fitted attributes, trailing underscore),
`_apply(scores) -> [N, C]` (float64 log-scores whose softmax is the calibrated prediction),
`_module()` (the same map as an exportable module, `to_module`'s), `_entry()` / `_tensors()`
(what `save` stores) and `_restore(entry, tensors) -> state`.

The registry: a subclass that declares a display `name` is a map the applications offer, in
`Calibrator.registry` (key -> class) from the moment it is defined; it declares in its own
class body all they need to know of it (its key `method`, `name`, `table_name`, `growth`,
`kinds`, its places in the listings `order` / `simplicity` / `cost_order`,
`on_logits_default`), and `compare`, `AutoSelect`, the bench, the framework callbacks and
`peg.apps.registry` read it through `calibrators()`; nothing outside this package lists the
maps (docs/architecture.md, "How to add a calibrator").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from peg.loading import CALIBRATORS
from peg.methods import _constraints as checks
from peg.methods._predictors import (
    SavedLogits,
    check_classes,
    first_labelled,
    iter_member_logits_of,
    logits_and_labels,
    member_logits_of,
    predictor_meta,
    read_predictor,
    scores_of,
)
from peg.methods.base import Method
from peg.methods.calibration._calibrator_archive import stored as stored
from peg.methods.calibration._export import CalibrationMap
from peg.methods.calibration._kinded import Kinded, check_integer
from peg.methods.calibration._streamed import Batches, predictor_batches
from peg.source import Data, is_pair
from peg.source._kinds import TASKS, Kind, read_kind
from peg.source._values import check_labels, refuse_one_class, warn_absent_classes
from peg.source.batches import BatchFn, check_batch_fn

# `to_module`'s builders of the maps that declare no `_module` of their own, by `method`
# (`LabelShift`'s, in `_label_shift`)
EXPORTS: dict[str, Callable[[Any], CalibrationMap]] = {}
# the kinds of input a map may declare: single-label logits `[N, C]` (C >= 2) with labels `[N]`;
# one score per row `[N]` (or `[N, 1]`) with 0/1 labels; a multi-label head `[N, K]` with
# multi-hot labels `[N, K]`; dense logits `[B, C, *S]` with labels `[B, *S]`
KINDS = ("multiclass", "binary", "multilabel", "dense")
# how every calibrator reads its data (`LabelShift`'s table, which takes no kind argument)
READING: Mapping[str, checks.Check] = {
    "batch_size": checks.positive_int(),
    "batch_fn": checks.batch_fn,
}


class Calibrator(Kinded, Method):
    """Base of the post-hoc calibrators (see the module doc): `fit(predictor, val)`,
    `member_logits(X) -> [1, N, C]`, `iter_member_logits`, `scale(logits)`, `predict_proba`,
    `predict`, `save(path)`; `peg.load(path, model)` gives a fitted one back."""

    method: ClassVar[str] = ""
    label: ClassVar[str] = ""
    # --- the registry (`Calibrator.registry`: key -> class): a class that declares a display
    # `name` is a map of logits every application offers by it (compare, AutoSelect, bench,
    # the callbacks); what they need to know of it is declared here, in its own class body
    name: ClassVar[str] = ""  # display name: compare's and AutoSelect's row, "TS"
    table_name: ClassVar[str] = ""  # the bench's table name ("Temp-scaled"; "": `name`)
    # how its fitted parameters grow with the classes C: 0 a few whatever C, 1 O(C), 2 O(C²)
    # (AutoSelect prices a map by it before it has run)
    growth: ClassVar[int] = 2
    kinds: ClassVar[tuple[str, ...]] = ("multiclass",)  # the kinds of input it accepts
    # its place among the maps: listed (compare's catalogue, the registry), from the simplest
    # (AutoSelect's ties), in AutoSelect's fitting order (value per cost); unset: after them
    order: ClassVar[float] = math.inf
    simplicity: ClassVar[float] = math.inf
    cost_order: ClassVar[float] = math.inf
    on_logits_default: ClassVar[bool] = False  # among the defaults on saved logits
    # a full map priced before it has run by the measured fold of the map of this key (its
    # diagonal map) × AutoSelect's `full_map_factor(C)`
    priced_from: ClassVar[str] = ""
    # the key of the simpler map a fit is where its cross-validated strengths made it that
    # map, by the kind `_affine_select.reduces_to` names ("temperature", "diagonal")
    parents: ClassVar[Mapping[str, str]] = {}
    registry: ClassVar[dict[str, type[Calibrator]]] = {}
    # parameters per class (vector / matrix scaling, Dirichlet, binning): a class absent from
    # the labels is warned of at fit (`peg.source._values.warn_absent_classes`)
    class_wise: ClassVar[bool] = False
    # fits dense outputs of a model streamed (`_fit_stream`: the forwards run again on every
    # pass), never gathering their rows `[R, C]`
    streams: ClassVar[bool] = False
    batch_size: int
    batch_fn: BatchFn | None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        offered = "name" in cls.__dict__ and bool(cls.name)  # a map the applications offer
        if offered and (
            not cls.method or set(cls.kinds) - set(KINDS) or cls.growth not in (0, 1, 2)
        ):
            raise TypeError(  # before anything registers it
                f"{cls.__name__}: a registered calibrator needs a `method` key, `kinds` among "
                f"{KINDS} and `growth` 0, 1 or 2 (got {cls.method!r}, {cls.kinds!r}, "
                f"{cls.growth!r})"
            )
        if "method" in cls.__dict__:  # a concrete calibrator: its archives load as it
            CALIBRATORS.add(cls.method, cls._from_archive)
        if offered:
            Calibrator.registry[cls.method] = cls

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "task": checks.one_of(*TASKS),
        "ignore_index": checks.described(check_integer, "an integer (a label left out)"),
        "per_label": checks.boolean(),
        "class_dim": checks.one_of(None, 1, -1),
        **READING,
    }

    # ---------------------------------------------------------------- subclass hooks
    def _score_kind(self, logits: Tensor) -> str:
        """What the map is fitted on and applied to, given the predictor's logits `[M, N, C]`."""
        return "log_probs"

    def _check_classes(self, classes: int) -> None:
        """A clear error for arguments that do not suit C classes (checked before fitting);
        every map needs two (one class: its probability is 1 whatever the map)."""
        if classes < 2:
            raise ValueError(f"val: {self.label} needs at least 2 classes, got {classes}")

    def _fitted_classes(self) -> int | None:
        """C of the fitted map (`n_classes_`; None: a map loaded from an archive written before
        C was recorded, whose arrays do not fix it: any C)."""
        return self.__dict__.get("n_classes_")

    def _classes_of(self, state: Mapping[str, Any]) -> int | None:
        """C that the fitted state's arrays fix (vector scaling's bias `[C]`, ...), or None for
        a map whose arrays do not depend on C (temperature scaling, spline, ...): what an
        archive's `"n_classes"` is checked against, and C of an archive written without it."""
        return None

    def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
        raise NotImplementedError

    def _fit_stream(self, batches: Batches, kind: Kind) -> dict[str, Any]:
        """The fitted state from dense scores read pass after pass (`streams`): `batches()`
        gives `(scores [B, C, *S] (or [B, *S, C], `kind.class_dim`), labels [B, *S])`."""
        raise NotImplementedError

    def _apply(self, scores: Tensor) -> Tensor:
        raise NotImplementedError

    def _entry(self) -> dict[str, Any]:
        """The fitted map's scalars, saved (JSON) in the archive's `"calibration"` entry."""
        return {}

    def _tensors(self) -> dict[str, Tensor]:
        """The fitted map's arrays, saved as safetensors beside the members."""
        return {}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        """The fitted state from what `save` stored (`ArchiveError` when it is not valid)."""
        raise NotImplementedError

    def _module(self) -> CalibrationMap | None:
        """The fitted map as a module (`to_module`'s: a `_export.CalibrationMap` of its
        arrays, beside `_apply`), or None: no exported form."""
        build = EXPORTS.get(type(self).method)
        return None if build is None else build(self)

    def _described(self) -> dict[str, Any]:
        """`meta_` beyond method and predictor: the arguments, what the map acts on
        (`fitted_on`: "log_probs" or "logits"), the map's scalars and C."""
        return {
            **self._json_params(),
            "fitted_on": self.scores_,
            **self._map_entry(),
            **self._width(),
        }

    def _width(self) -> dict[str, Any]:
        """`{"n_classes": C}`, or nothing for a map of unknown C (an older archive's)."""
        classes = self._fitted_classes()
        return {} if classes is None else {"n_classes": int(classes)}

    # ---------------------------------------------------------------- fitting
    def fit(
        self,
        predictor: Any,
        val: Data | None = None,
        *,
        bn_data: Data | None = None,
        classes: Any = None,
    ) -> Calibrator:
        """Fit the map on validation data `val` ((X, y), Dataset or DataLoader, batches of any
        shape); returns self.

        The kind of input is read from the logits' and labels' shapes (`peg.source._kinds`,
        settled by `task`): multiclass `[N, C]` with `[N]`; binary scores `[N]` or `[N, 1]`
        with 0/1 labels; multilabel `[N, K]` with multi-hot `[N, K]`; dense `[B, C, *S]` (or a
        language model's `[B, T, V]`) with `[B, *S]`. Labels equal to `ignore_index` are left
        out. The map is fitted on the canonical rows of that kind (`kind_`), once, or once per
        label with `per_label=True` (multilabel).

        Args:
            predictor: an nn.Module returning logits, or anything with `member_logits(X)` (an
                `Ensemble`, a fitted method); or saved logits (a tensor or a NumPy array,
                memory-mapped too, of any of the shapes above), `val` then their labels:
                `fit(logits, labels)` is `fit(nn.Identity(), (logits, labels))`
                (`read_predictor`).
            val: labelled validation data (required). A loader is read once, its inputs never
                gathered: the predictor reads it batch by batch and the labels are collected as
                it goes (`logits_and_labels`). A model's dense outputs (`[B, C, *S]`, told by
                the first batch's logits and labels) fitted by a map that `streams`
                (temperature scaling) are never gathered: the data are read again on every
                pass (`_streamed.fit_temperature_streamed`), the peak one batch.
            bn_data: unused (accepted as by every post-hoc method).
            classes: the class of each logit column, in order (e.g. `["cat", "dog"]`), where
                the labels name their classes (strings): each label is read as its class's
                column. Labels that are strings without it are refused.
        """
        self._check_params()  # as the constructor did: catches an attribute set directly
        # fit(logits, labels): SavedLogits(); labels named by `classes` read as their indices
        predictor, val = read_predictor(predictor, val, classes=classes, kinds=True)
        if val is None:
            raise ValueError(f"val: {self.label} needs labelled validation data (X, y)")
        labels = val[1] if is_pair(val) else None
        if isinstance(labels, (Tensor, np.ndarray)) and labels.ndim == 1 and labels.dtype != bool:
            # labels that cannot be labels (floats, negative): said before the forwards
            check_labels(labels[labels != self.ignore_index], None, None, name="val labels")
        streamed = self._streamed(predictor, val, classes)
        if streamed is not None:  # dense outputs of a model: never gathered
            self._set_fitted(predictor, streamed)
            return self
        logits, y = logits_and_labels(  # one class only: refused below, not warned of
            predictor, val, int(self.batch_size), check_batch_fn(self.batch_fn), "val", False
        )
        shape = tuple(logits.shape[1:])
        kind = read_kind(shape, y, self.task, self.ignore_index, class_dim=self.class_dim)
        kind = self._declared(kind)
        if self.per_label:
            state = self._fit_per_label(kind, logits, y)
        else:
            score_kind, scores, y = self._fit_rows(kind, logits, y)
            check_classes(classes, scores.shape[1])
            self._check_classes(scores.shape[1])
            refuse_one_class(y, "val labels", self.label)
            if self.class_wise:
                warn_absent_classes(y, scores.shape[1], "val", self.label)
            state = {**self._fit_map(scores, y), "scores_": score_kind}
        self._set_fitted(predictor, {**state, "n_classes_": kind.width, "kind_": kind})
        return self

    def _streamed(self, predictor: Any, val: Data, classes: Any) -> dict[str, Any] | None:
        """The fitted state of a map that `streams`, fitted on a predictor's dense outputs pass
        after pass; None where they are read whole (`fit`'s gathered path): another kind
        (told by the first batch's logits and labels, `first_labelled`: one forward, and none
        for labels `[N]`), saved logits (in memory already), `per_label`, another map."""
        if not type(self).streams or self.per_label or isinstance(predictor, SavedLogits):
            return None
        size, split = int(self.batch_size), check_batch_fn(self.batch_fn)
        first = first_labelled(predictor, val, size, split, "val")
        if first is None:
            return None
        shape = tuple(first[0].shape[1:])
        kind = read_kind(shape, first[1], self.task, self.ignore_index, class_dim=self.class_dim)
        if kind.kind != "dense":
            return None
        kind = self._declared(kind)
        check_classes(classes, kind.width)
        batches = predictor_batches(predictor, val, size, split, kind.class_dim)
        state = self._fit_stream(batches, kind)
        return {**state, "scores_": "log_probs", "n_classes_": kind.width, "kind_": kind}

    def _declared(self, kind: Kind) -> Kind:
        """`kind` when this map declares it (`kinds`) and `per_label` suits it; a ValueError
        naming the map, the kind and the maps that take it otherwise."""
        name = type(self).__name__
        if kind.kind not in type(self).kinds:
            takers = [c.__name__ for c in calibrators(kind.kind)]
            hint = (  # one-hot class labels look multi-hot: the fix of a multiclass user
                "; one-hot class labels are read as multi-hot: pass labels.argmax(1)"
                if kind.kind == "multilabel"
                else ""
            )
            raise ValueError(
                f"val: {name} does not take {kind.kind} input ({kind.describe()}); it takes "
                f"{', '.join(type(self).kinds)}. The maps that take {kind.kind} input "
                f"(calibrators({kind.kind!r})): {takers}{hint}"
            )
        if self.per_label and kind.kind != "multilabel":
            raise ValueError(
                f"per_label: fits one map per label of a multilabel head (logits [N, K] with "
                f"multi-hot labels [N, K]), got {kind.describe()}; pass per_label=False"
            )
        return kind

    def _set_fitted(self, predictor: Any, state: Mapping[str, Any]) -> None:
        self.__dict__.update(state)
        self.predictor_ = predictor
        meta: dict[str, Any] = {"method": type(self).method, **self._described()}
        described = predictor_meta(predictor)
        if described is not None:
            meta["predictor"] = described
        self.meta_ = meta  # last: `fitted_attribute`

    # ---------------------------------------------------------------- predicting
    def member_logits(
        self, X: Data, batch_size: int | None = None, batch_fn: BatchFn | None = None,
        **options: Any,
    ) -> Tensor:  # fmt: skip
        """Calibrated scores `[1, N, C]` (one "member": the calibrated predictor), whose softmax
        is the calibrated prediction."""
        self._check_fitted()
        size, split = self._reading(batch_size, batch_fn)
        # mapped whole (not the concatenated `iter_member_logits`): `peg.distributed` gathers
        # the predictor's logits and maps them as one process does, on the same shapes
        return self.scale(member_logits_of(self.predictor_, X, size, split, **options), "X")

    def iter_member_logits(
        self, X: Data, batch_size: int | None = None, batch_fn: BatchFn | None = None,
        **options: Any,
    ) -> Iterator[Tensor]:  # fmt: skip
        """`member_logits` batch by batch, `[1, B_j, C]`: the map is a per-row transform, here
        of the predictor's batches (equal to `member_logits` up to rounding: the same per-row
        operations on other shapes); `NotStreamable` if the predictor cannot give them."""
        self._check_fitted()
        size, split = self._reading(batch_size, batch_fn)
        batches = iter_member_logits_of(self.predictor_, X, size, split, **options)
        return self._scaled(batches)

    def _scaled(self, batches: Iterator[Tensor]) -> Iterator[Tensor]:
        start = 0  # the first row of each batch in X: what an error names
        for logits in batches:
            yield self.scale(logits, "X", start)
            start += logits.shape[1]

    def scale(self, logits: Tensor, name: str = "logits", start: int | None = None) -> Tensor:
        """Calibrated scores `[1, N, C]` (float32) from the predictor's logits `[M, N, C]`
        (finite: `scores_of`; an error names `name`, and rows from `start` for a batch; logits
        of another width than the map's refused); for another kind, the calibrated native
        logits `[1, *shape]` of member logits `[M, *shape]` (binary `[1, N]`, multilabel
        `[1, N, K]`: sigmoid gives P(y = 1); dense `[1, B, C, *S]`: softmax over the classes).
        The map is float64 throughout; the cast to float32 cannot overflow (`in_float32`)."""
        self._check_fitted()
        kind = self._kind()
        if kind is None or kind.kind == "multiclass":
            self._check_width(logits, name)
            return self._mapped(logits, name, start)
        if logits.ndim < 2:
            raise ValueError(
                f"{name}: expected member logits [M, *shape], got shape {tuple(logits.shape)}"
            )
        mapped = self._mapped(kind.rows(logits, name), name, start)  # [1, R, W]
        return kind.native(mapped, tuple(logits.shape[1:]))

    def _mapped(self, logits: Tensor, name: str = "logits", start: int | None = None) -> Tensor:
        """The map of logits `[M, N, W]` of any width W, `[1, N, W]` (`peg.load`'s probe of a
        map whose arrays do not fix C, at fewer columns than a header's C)."""
        scores = self._applied(scores_of(logits, self.scores_, name, start))
        return in_float32(scores, self.label, name, start).unsqueeze(0)

    def _check_width(self, logits: Tensor, name: str) -> None:
        """A ValueError naming `name` and both counts unless `logits` `[..., C]` has the C the
        map was fitted on (any width for a map of unknown C: an older archive's)."""
        classes = self._fitted_classes()
        if classes is not None and logits.shape[-1] != classes:
            source = "" if name == "logits" else f" from {name}"
            raise ValueError(
                f"{name}: this {type(self).__name__} was fitted on {classes} classes, got "
                f"logits with {logits.shape[-1]} columns{source} (shape {tuple(logits.shape)}); "
                "the predictor or the saved logits are not the ones it was fitted on"
            )

    def __len__(self) -> int:
        self._check_fitted()
        return 1

    def to_module(self) -> nn.Module:
        """The fitted map as a frozen `nn.Module`, logits `[N, C]` -> probabilities `[N, C]`
        (another kind: its native logits -> probabilities of their shape, `_kinded.KindMap`)
        (buffers only; for `torch.export.export` and `torch.onnx.export` with a dynamic batch
        dimension; `peg.methods.calibration._export`)."""
        self._check_fitted("exporting")
        maps = self.__dict__.get("label_maps_")
        module = self._kind_module(self._module() if maps is None else None)
        if module is None:
            raise TypeError(
                f"to_module: {type(self).__name__} has no exported form (it is not a map of "
                f"logits alone); the calibrators have one: {sorted(Calibrator.registry)}"
            )
        if self._multiclass():
            module.classes = self._fitted_classes()  # its logits' C checked against the map's
        return module.requires_grad_(False).eval()


def calibrators(kind: str | None = None) -> list[type[Calibrator]]:
    """The registered maps (`Calibrator.registry`), in their listed `order` (then by key),
    those accepting `kind` where given: what every application reads."""
    found = [c for c in Calibrator.registry.values() if kind is None or kind in c.kinds]
    return sorted(found, key=lambda c: (c.order, c.method))


def display_names(rank: str) -> tuple[str, ...]:
    """The registered maps' display names ordered by `rank` ("order", "simplicity" or
    "cost_order"; ties by the listed order)."""
    ranked = sorted(calibrators(), key=lambda c: (getattr(c, rank), c.order, c.method))
    return tuple(c.name for c in ranked)


def table_name(cls: type[Calibrator]) -> str:
    """`cls`'s name in the bench's tables (`table_name`, else its display `name`)."""
    return cls.table_name or cls.name


F32_SAFE = 2.0**127  # float64 scores within ±this keep their differences in a float32 cast


def in_float32(scores: Tensor, label: str, name: str, start: int | None = None) -> Tensor:
    """Calibrated float64 scores `[N, C]` as float32 with the same softmax: a row whose largest
    score lies beyond ±2¹²⁷ (a map with slopes > 1 on float32-max logits) is shifted by it
    first, which the softmax ignores (a +inf score takes the row's mass, shared by ties), so
    the cast never makes inf - inf = NaN. A NaN row, or one whose every score is -inf, has no
    probabilities: an error naming the map (`label`) and the first such row of `name`."""
    top = scores.amax(-1, keepdim=True)
    if bool((top.abs() <= F32_SAFE).all()):  # one synchronisation; NaN fails the test
        return scores.float()
    lost = (torch.isnan(scores).any(-1, keepdim=True) | torch.isneginf(top))[:, 0]
    if bool(lost.any()):
        row = int(lost.nonzero()[0, 0]) + (start or 0)
        raise FloatingPointError(
            f"{name}: {label} gives no probabilities (NaN or every score -inf) for "
            f"{int(lost.sum())} of {len(lost)} rows of finite logits, the first row {row}: "
            "the fitted map is degenerate"
        )
    shifted = torch.where(
        torch.isposinf(top),
        torch.where(torch.isposinf(scores), 0.0, -math.inf),
        scores - top,
    )
    return torch.where(top.abs() <= F32_SAFE, scores, shifted).float()
