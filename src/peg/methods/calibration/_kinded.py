"""The calibrators on every kind of input (`Kinded`, a base of
`peg.methods.calibration._calibrator.Calibrator`): a map only ever sees canonical multiclass
rows `[R, W]` (`peg.source._kinds`); here, the rows of a fit (ignored labels left out), one map
per label of a multilabel head (`per_label=True`: a clone of the map fitted on each label's
rows `rows[k::K]`), predictions back in the input's shape (`predict_proba`: binary `[N]`
P(y = 1), multilabel `[N, K]`, dense `[B, C, *S]`), the kind and the per-label maps in an
archive, and the exported module of a kind (`KindMap`: native logits to native-shaped
probabilities).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from peg.errors import ArchiveError
from peg.methods._predictors import scores_of
from peg.methods.calibration._calibrator_archive import Archived
from peg.runtime.predicts import Predicts, refuse_tracing
from peg.source import Data
from peg.source._kinds import IGNORE_INDEX, Kind
from peg.source._namespace import like_input
from peg.source._values import as_tensor, check_labels, refuse_one_class

LABEL = "label{}/"  # the prefix of label k's arrays in the archive of a per-label map


def check_integer(value: Any, name: str) -> None:
    """`ignore_index`: an int (Python's or NumPy's, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an integer (a label left out), got {value!r}")


class Kinded(Archived, Predicts):
    """What every kind of input adds to a calibrator (a mixin of `Calibrator`, whose arguments
    `task`, `ignore_index`, `per_label` and hooks `_fit_map`, `_apply`, `_entry`, `_tensors`,
    `_restore`, `_module`, `_score_kind` it reads)."""

    # the kind arguments' values for a calibrator that does not take them (`LabelShift`, the
    # conformal predictors): multiclass input, read as before kinds existed
    task: str = "auto"
    ignore_index: int = IGNORE_INDEX
    per_label: bool = False
    class_dim: int | None = None
    label: str
    # what `Calibrator` and `Params` define
    get_params: Callable[..., dict[str, Any]]
    _score_kind: Callable[[Tensor], str]
    _fit_map: Callable[[Tensor, Tensor], dict[str, Any]]
    _apply: Callable[[Tensor], Tensor]
    _entry: Callable[[], dict[str, Any]]
    _tensors: Callable[[], dict[str, Tensor]]

    def _kind(self) -> Kind | None:
        """The fitted kind (`kind_`), None for a map loaded from an archive that recorded none
        (multiclass, as every map was before kinds)."""
        return self.__dict__.get("kind_")

    def _multiclass(self) -> bool:
        kind = self._kind()
        return kind is None or kind.kind == "multiclass"

    # ---------------------------------------------------------------- fitting
    def _fit_rows(self, kind: Kind, logits: Tensor, y: Any) -> tuple[str, Tensor, Tensor]:
        """What the map is fitted on (`_score_kind`), its scores `[R, W]` (float64) and labels
        `[R]` from member logits `[M, *shape]` and labels in the kind's shape; rows whose label
        is `ignore_index` left out. Class labels' values are checked by `check_labels` (one
        message for every multiclass fit); 0/1 labels by the kind (`Kind.row_labels`)."""
        rows = kind.rows(logits, "val")
        if kind.kind in ("binary", "multilabel"):
            flat = kind.row_labels(y, "val labels")
        else:
            flat = as_tensor(y, "val labels").reshape(-1)
        rows, flat = kind.kept(rows, flat.to(rows.device))
        score_kind = self._score_kind(rows)
        scores = scores_of(rows, score_kind, "val")
        flat = check_labels(flat, *scores.shape, name="val labels", device=scores.device)
        return score_kind, scores, flat

    def _fit_per_label(self, kind: Kind, logits: Tensor, y: Any) -> dict[str, Any]:
        """One clone of the map per label k of a multilabel head, fitted on its rows
        `rows[k::K]` (its ignored entries left out): `label_maps_`, K of them."""
        rows = kind.rows(logits, "val")
        flat = kind.row_labels(y, "val labels").to(rows.device)
        score_kind, maps = self._score_kind(rows), []
        for k in range(kind.outputs):
            own_rows, own_y = kind.kept(rows[:, k :: kind.outputs], flat[k :: kind.outputs])
            name = f"val labels (label {k})"
            scores = scores_of(own_rows, score_kind, f"val (label {k})")
            own_y = check_labels(own_y, *scores.shape, name=name, device=scores.device)
            refuse_one_class(own_y, name, f"{self.label} per label")
            clone = self._label_clone(score_kind)
            clone.__dict__.update(clone._fit_map(scores, own_y))
            maps.append(clone)
        return {"label_maps_": maps, "scores_": score_kind}

    def _label_clone(self, score_kind: str) -> Any:
        """An unfitted copy of this map for one label (`per_label` False), acting on
        `score_kind` scores of 2 columns."""
        params = {**self.get_params(deep=False), "per_label": False}
        clone = type(self)(**params)
        clone.__dict__.update(scores_=score_kind, n_classes_=2)
        return clone

    def _applied(self, scores: Tensor) -> Tensor:
        """The fitted map on scores `[R, W]` (float64 log-scores `[R, W]`); per label, label k's
        map on rows `k::K`."""
        maps = self.__dict__.get("label_maps_")
        if maps is None:
            return self._apply(scores)
        out = torch.empty_like(scores)
        for k, fitted in enumerate(maps):
            out[k :: len(maps)] = fitted._apply(scores[k :: len(maps)])
        return out

    # ---------------------------------------------------------------- predicting
    def predict_proba(self, X: Data, batch_size: int | None = None, **options: Any) -> Any:
        """Calibrated probabilities in the input's shape: `[N, C]` (multiclass), P(y = 1) `[N]`
        or `[N, 1]` (binary), each label's P(y = 1) `[N, K]` (multilabel), `[B, C, *S]` (dense,
        the classes where the logits have them); NumPy for NumPy inputs."""
        kind = self._kind()
        if kind is None or kind.kind == "multiclass":
            return super().predict_proba(X, batch_size, **options)
        refuse_tracing(type(self).__name__)
        logits = self.member_logits(X, batch_size, **options)
        return like_input(kind.proba(logits), X)

    def predict(self, X: Data, batch_size: int | None = None, **options: Any) -> Any:
        """Predicted labels: the class `[N]` (multiclass), `[B, *S]` (dense); 0/1 per entry
        where P(y = 1) > 1/2 (binary `[N]`, multilabel `[N, K]`)."""
        kind = self._kind()
        if kind is None or kind.kind == "multiclass":
            return super().predict(X, batch_size, **options)
        refuse_tracing(type(self).__name__)
        logits = self.member_logits(X, batch_size, **options)
        return like_input(kind.decide(kind.proba(logits)), X)

    # ---------------------------------------------------------------- archives
    def _map_entry(self) -> dict[str, Any]:
        """The map's scalars for the archive and `meta_`: `_entry()`, or each label's under
        `"labels"`; with the kind (`"kind"`) for any but multiclass input."""
        maps = self.__dict__.get("label_maps_")
        entry = self._entry() if maps is None else {"labels": [m._entry() for m in maps]}
        kind = self._kind()
        return (
            entry if kind is None or kind.kind == "multiclass" else {**entry, "kind": kind.entry()}
        )

    def _map_tensors(self) -> dict[str, Tensor]:
        """The map's arrays: `_tensors()`, or label k's under `label{k}/`."""
        maps = self.__dict__.get("label_maps_")
        if maps is None:
            return self._tensors()
        return {LABEL.format(k) + n: t for k, m in enumerate(maps) for n, t in m._tensors().items()}

    def _restored(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        """The fitted state from an archive's entry: the kind (`kind_`; a multiclass kind of
        the entry's C when it names none) and the map, or each label's (`label_maps_`)."""
        try:
            kind = Kind.from_entry(entry["kind"]) if "kind" in entry else None
        except ValueError as e:
            raise ArchiveError(f"calibration: {e}") from None
        labels = entry.get("labels")
        if labels is None:
            state = super()._restored(entry, tensors)
        else:
            if not isinstance(labels, list) or not labels or kind is None:
                raise ArchiveError("calibration: labels must be a list of maps, with a kind")
            maps = self._restored_labels(entry, labels, tensors)
            # per_label: an argument, but what the archive holds (TS's entry keeps no arguments)
            state = {"label_maps_": maps, "n_classes_": 2, "per_label": True}
        classes = state.get("n_classes_")
        if kind is None and isinstance(classes, int) and classes >= 2:
            kind = Kind("multiclass", classes, classes)
        return {**state, "kind_": kind}

    def _restored_labels(
        self, entry: Mapping[str, Any], labels: list[Any], tensors: Mapping[str, Tensor]
    ) -> list[Any]:
        maps = []
        for k, own in enumerate(labels):
            if not isinstance(own, dict):
                raise ArchiveError(f"calibration: labels[{k}] must be a mapping, got {own!r}")
            prefix = LABEL.format(k)
            arrays = {n[len(prefix) :]: t for n, t in tensors.items() if n.startswith(prefix)}
            clone = self._label_clone(str(entry.get("fitted_on", "log_probs")))
            clone.__dict__.update(clone._restore(own, arrays))
            maps.append(clone)
        return maps

    # ---------------------------------------------------------------- export
    def _kind_module(self, module: nn.Module | None) -> nn.Module | None:
        """`to_module`'s module of a kind: the map's own (multiclass), or `KindMap` around it
        (or around each label's map); None: no exported form."""
        kind = self._kind()
        if kind is None or kind.kind == "multiclass":
            return module
        maps = self.__dict__.get("label_maps_")
        if maps is not None:
            modules = [m._module() for m in maps]
            if any(m is None for m in modules):
                return None
            for m in modules:
                m.classes = 2
            return KindMap(kind, nn.ModuleList(modules))
        if module is None:
            return None
        module.classes = kind.width
        return KindMap(kind, nn.ModuleList([module]))


class KindMap(nn.Module):
    """A fitted map of rows as a module of the native logits: binary `[N]` / `[N, 1]` scores ->
    P(y = 1) in their shape, multilabel `[N, K]` -> `[N, K]`, dense `[B, C, *S]` (or
    `[B, *S, C]`) -> probabilities of that shape; per label, label k's map on column k."""

    def __init__(self, kind: Kind, maps: nn.ModuleList) -> None:
        super().__init__()
        self.kind, self.maps = kind, maps
        self.classes: int | None = None

    def forward(self, logits: Tensor) -> Tensor:
        kind = self.kind
        shape = logits.shape
        if not torch.jit.is_tracing() and not torch.compiler.is_compiling():
            kind.check(tuple(shape), "logits")
        if len(self.maps) > 1:  # one map per label: column k through label k's map
            s = logits.reshape(shape[0], -1)
            cols = [
                m(torch.stack([torch.zeros_like(s[:, k]), s[:, k]], -1))[:, 1]
                for k, m in enumerate(self.maps)
            ]
            return torch.stack(cols, -1).reshape(shape)
        rows = kind.rows(logits.unsqueeze(0), "logits")[0]
        return kind.back(self.maps[0](rows), shape)
