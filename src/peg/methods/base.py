"""The method contract, and the verbs every fitted method shares.

`Method` is what every method class is (scikit-learn's estimator protocol): constructor
arguments stored as given under their own names, `get_params` / `set_params` (so
`sklearn.base.clone` works), a `repr` showing them, `fit(...)` returning self, fitted state under
names with a trailing underscore, and `NotFittedError` for any of those asked before `fit`. The
argument protocol itself (`Params`, `store_arguments`) is `peg.methods._arguments`, re-exported
here.
`FittedEnsemble` predicts through the `Ensemble` it holds; `ModulePredictor` runs one module of
its own per batch (MC dropout, MC patching, Packed-Ensembles).

Names shared by every class: `n_members` (members made, per base model for PEG/PEP),
`batch_size` (rows per forward pass), `seed`, `progress`.

The predictor protocol, the same on every fitted object (methods, calibrators, conformal
predictors, `AutoSelect`; `peg.Ensemble` takes the same keywords):
`member_logits(X, batch_size=None, *, batch_fn=None, progress=None, autocast=None, **options)`
`-> [M, N, C]`, `iter_member_logits(...)` with the same arguments `-> [M, B_j, C]` per batch,
`predict_proba(X, batch_size=None, **same) -> [N, C]`, `predict -> [N]`. `batch_size` and
`batch_fn` left None are the constructor's (`Method._reading`); `options` are what the
predictor's `Ensemble` takes beyond them (`strategy`, `chunk_size`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor, nn

from peg._forward import diagnose
from peg.ensemble import Ensemble
from peg.errors import NotFittedError
from peg.methods import _constraints as checks
from peg.methods._arguments import ACCEPTED as ACCEPTED
from peg.methods._arguments import Params
from peg.methods._arguments import store_arguments as store_arguments
from peg.methods._display import Display
from peg.output import model_output
from peg.runtime.predicts import Predicts, _cat_batches, autocast_dtype
from peg.source import Data, Source
from peg.source._devices import model_device, move
from peg.source.batches import BatchFn, call_model, check_batch_fn
from peg.streams import generator
from peg.utils.memory import require_memory
from peg.utils.progress import bar
from peg.utils.scalars import check_positive_int


def is_fitted(obj: Any) -> bool:
    """Whether `obj` is a fitted method (False for anything else: a module, an `Ensemble`, ...)."""
    return isinstance(obj, Method) and obj.__sklearn_is_fitted__()


class Method(Display, Params):
    """The contract of every method class (see the module doc); shown in a notebook by
    `Display` (its arguments and fitted values, as HTML and markdown).

    Fitted or not is one question, asked one way: `fit` sets the attribute named
    `fitted_attribute` last, so its presence means fitted (`__sklearn_is_fitted__`, which
    scikit-learn's `check_is_fitted` asks; `is_fitted(obj)` from outside), and `_check_fitted`
    raises `NotFittedError` before it is there."""

    fitted_attribute: ClassVar[str] = "meta_"

    def __sklearn_is_fitted__(self) -> bool:
        return self.fitted_attribute in self.__dict__

    def __sklearn_tags__(self) -> Any:
        """scikit-learn's estimator tags (`check_is_fitted` reads them): no estimator type, no
        target required; imported here, for whoever asks has scikit-learn loaded."""
        from sklearn.utils import Tags, TargetTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=False))

    def _check_fitted(self, doing: str = "predicting") -> None:
        """Raise `NotFittedError` (saying what was attempted, `doing`) before `fit`."""
        if not self.__sklearn_is_fitted__():
            raise NotFittedError(f"{type(self).__name__}: call fit(...) before {doing}")

    def _reading(
        self, batch_size: int | None, batch_fn: BatchFn | None
    ) -> tuple[int, BatchFn | None]:
        """The predictor protocol's `batch_size` and `batch_fn` for one call: those given win,
        None means the constructor's (512 and `peg.source.batches`' conventions for a class
        without them). A `Source` given as data keeps its own (`Source.of`)."""
        own = self.__dict__.get("batch_size", 512)
        size = check_positive_int(own if batch_size is None else batch_size, "batch_size")
        split = check_batch_fn(self.__dict__.get("batch_fn") if batch_fn is None else batch_fn)
        return size, split

    def __getattr__(self, name: str) -> Any:
        # only reached when normal lookup failed: a fitted attribute before `fit`, or a property
        # that raised AttributeError itself (run again, so that its own message is the one seen)
        prop = getattr(type(self), name, None)
        if isinstance(prop, property) and prop.fget is not None:
            return prop.fget(self)
        if name.endswith("_") and not name.startswith("__"):
            raise NotFittedError(
                f"{type(self).__name__}: {name} is set by fit(...); call fit before using it"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class FittedEnsemble(Predicts, Method):
    """`member_logits`, `predict_proba`, `predict` and `save` delegate to `ensemble_`; PEG and
    PEP (`PerturbationEnsemble`) to their members at the chosen scale, through `_held`."""

    ensemble_: Ensemble
    fitted_attribute: ClassVar[str] = "ensemble_"

    def _held(self) -> Held:
        """What answers for the fitted members (raises NotFittedError before `fit`)."""
        self._check_fitted()
        return self.ensemble_

    def ensemble(self) -> Ensemble:
        """The fitted `Ensemble` (raises NotFittedError before `fit`)."""
        self._check_fitted()
        return self.ensemble_

    @property
    def meta_(self) -> dict[str, Any]:
        """What was fitted: method, hyper-parameters, seed, ... (saved with the ensemble)."""
        return self._held().meta

    def member_logits(
        self,
        X: Data,
        batch_size: int | None = None,
        *,
        batch_fn: BatchFn | None = None,
        **options: Any,
    ) -> Tensor:
        """Logits of every member, `[M, N, C]` (the predictor protocol; `progress`, `autocast`,
        `strategy`, `chunk_size` as `Ensemble.member_logits`)."""
        held = self._held()
        size, split = self._reading(batch_size, batch_fn)
        return held.member_logits(X, size, batch_fn=split, **options)

    def iter_member_logits(
        self,
        X: Data,
        batch_size: int | None = None,
        *,
        batch_fn: BatchFn | None = None,
        **options: Any,
    ) -> Iterator[Tensor]:
        """`member_logits` batch by batch, `[M, B_j, C]` (see `Ensemble.iter_member_logits`)."""
        held = self._held()
        size, split = self._reading(batch_size, batch_fn)
        return held.iter_member_logits(X, size, batch_fn=split, **options)

    def save(self, path: str) -> str:
        """Save the fitted ensemble (safetensors + JSON); load it with `peg.load(path, model)`."""
        return self.ensemble().save(path)

    def __len__(self) -> int:
        return len(self._held())


class Held(Protocol):
    """What `FittedEnsemble._held` gives: an `Ensemble`, or PEG/PEP's members at their scale
    (`peg.methods.perturbation._fitted_members.FittedMembers`)."""

    meta: dict[str, Any]

    def __len__(self) -> int: ...

    # (X, batch_size, *, batch_fn, **options) -> [M, N, C] / [M, B_j, C] batch by batch
    def member_logits(self, *args: Any, **kwargs: Any) -> Tensor: ...

    def iter_member_logits(self, *args: Any, **kwargs: Any) -> Iterator[Tensor]: ...


class ModulePredictor(Predicts, Method):
    """Base of the predictors that run one module of their own per batch, not stacked weights.

    MC dropout, MC patching (EMP/ECMP) and Packed-Ensembles keep a copy `model_` and produce all
    member outputs of a batch from it. Subclasses set `model_`, `batch_size`, `progress`,
    `batch_fn` and `label`, and implement `_prepare()` (module modes before predicting) and
    `_batch_logits(x, j) -> [M, B, C]` for batch j (`x` a tensor or structured inputs, on the
    model's device; see `peg.source.batches`).
    """

    model_: nn.Module
    batch_size: int
    progress: bool | None
    batch_fn: BatchFn | None
    label = "predict"
    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "batch_size": checks.positive_int(),
        "progress": checks.boolean(optional=True),
        "batch_fn": checks.batch_fn,
    }

    def _device(self) -> torch.device:
        return model_device(self.model_)

    def _probe(self, x: Any, name: str = "X") -> None:
        """One pass on two rows of `x`, moved to the model's device: a clear error naming `name`
        if they do not fit the model (`peg._forward.diagnose`); the global RNG is left as it is."""
        x = move(x, self._device(), name)
        devices = [self._device()] if self._device().type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            out = diagnose(lambda rows: self._forward(rows), x, name)
            model_output(out, name)

    def _forward(self, x: Any) -> Any:
        """One forward pass of `model_` (`model_(**x)` for a mapping)."""
        return call_model(self.model_, x)

    def _prepare(self) -> None:
        self.model_.eval()

    def _batch_logits(self, x: Any, j: int) -> Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def member_logits(
        self,
        X: Data,
        batch_size: int | None = None,
        progress: bool | None = None,
        autocast: str | torch.dtype | None = None,
        batch_fn: BatchFn | None = None,
        **_: Any,
    ) -> Tensor:
        """Logits of every member, `[M, N, C]`.

        Args:
            X: inputs `[N, ...]`, an (X, y) tuple, a mapping of tensors, or a Dataset/DataLoader
                of `x`, `(x, y, ...)` or mapping batches (`peg.source.batches`).
            batch_size: rows per forward pass for tensors (default: the constructor's).
            progress: progress bar over batches (default: the constructor's).
            autocast: "bf16" / "fp16": forwards under `torch.autocast`, float32 logits back
                (see `Ensemble.member_logits`).
            batch_fn: `batch_fn(batch) -> (inputs, y)` for batches of another shape (default:
                the constructor's).
        """
        return _cat_batches(self.iter_member_logits(X, batch_size, progress, autocast, batch_fn))

    @torch.no_grad()
    def iter_member_logits(
        self,
        X: Data,
        batch_size: int | None = None,
        progress: bool | None = None,
        autocast: str | torch.dtype | None = None,
        batch_fn: BatchFn | None = None,
        **_: Any,
    ) -> Iterator[Tensor]:
        """`member_logits` batch by batch: `[M, B_j, C]` for batch j, in order (the same
        batches, the same bits and, for sampled members, the same randomness: it is keyed by j)."""
        amp = autocast_dtype(autocast)
        split = check_batch_fn(self.batch_fn if batch_fn is None else batch_fn)
        self._check_fitted()
        size = (
            self.batch_size if batch_size is None else check_positive_int(batch_size, "batch_size")
        )
        self._prepare()  # in case model_ was switched to train/eval by someone since fit
        device = self._device()
        source = Source.of(X, split)
        batches = bar(
            source.inputs(size, device),
            self.label,
            total=source.num_batches(size),
            enabled=self.progress if progress is None else progress,
        )
        seen = False
        for j, x in enumerate(batches):
            try:
                if amp is None:
                    logits = self._batch_logits(x, j)
                else:
                    with torch.autocast(device.type, dtype=amp):
                        logits = self._batch_logits(x, j).float()
            except Exception:
                self._probe(x)  # the inputs or the model's output at fault: a clear error
                raise
            seen = True
            yield logits
        if not seen:
            raise ValueError("X: no inputs to predict (0 samples)")


class SampledPredictor(ModulePredictor):
    """A `ModulePredictor` whose members are `n_members` stochastic passes (MC dropout, MC
    patching).

    The randomness of member s on batch j comes from the global RNG reseeded from the stream
    (seed, s, j) inside `torch.random.fork_rng()`: it depends on nothing else (but on the
    batching), and the caller's RNG state is left untouched.
    """

    n_members: int
    seed: int
    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "n_members": checks.positive_int(),
        "seed": checks.positive_int(minimum=0),
        **ModulePredictor.parameter_constraints,
    }

    def _batch_logits(self, x: Any, j: int) -> Tensor:
        device = self._device()
        devices = [device] if device.type == "cuda" else []
        outs = []
        with torch.random.fork_rng(devices=devices):
            for s in range(self.n_members):
                torch.manual_seed(int(generator(int(self.seed), s, j).initial_seed()))
                outs.append(model_output(self._forward(x), "member_logits"))
                if s == 0:  # n_members = 10⁹ ran unbounded: refused once a batch's size is known
                    self._check_members_memory(outs[0])
        return torch.stack(outs)

    def _check_members_memory(self, out: Tensor) -> None:
        """A ValueError naming `n_members` where one batch's member logits `[S, B, C]` (`out`:
        member 0's `[B, C]`) cannot fit in the memory of their device."""
        need = 2 * self.n_members * out.numel() * out.element_size()  # the list, then its stack
        what = f"one batch's member logits [S, {len(out)}, {out.shape[-1]}], twice while stacked"
        require_memory(
            "n_members", self.n_members, need, out.device, what, "lower n_members or batch_size"
        )

    def __len__(self) -> int:
        self._check_fitted()
        return self.n_members
