"""The method contract, and the verbs every fitted method shares.

`Method` is what every method class is (scikit-learn's estimator protocol): constructor
arguments stored as given under their own names, `get_params` / `set_params` (so
`sklearn.base.clone` works), a `repr` showing them, `fit(...)` returning self, fitted state under
names with a trailing underscore, and `NotFittedError` for any of those asked before `fit`.
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

import inspect
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor, nn

from peg._forward import diagnose
from peg._memory import require_memory
from peg._progress import bar
from peg._scalars import check_positive_int
from peg.ensemble import Ensemble, Predicts, _cat_batches, autocast_dtype
from peg.errors import InvalidParameterError, NotFittedError
from peg.methods import _constraints as checks
from peg.methods._display import Display
from peg.output import model_output
from peg.source import Data, Source
from peg.source._devices import model_device, move
from peg.source.batches import BatchFn, call_model, check_batch_fn
from peg.streams import generator


def is_fitted(obj: Any) -> bool:
    """Whether `obj` is a fitted method (False for anything else: a module, an `Ensemble`, ...)."""
    return isinstance(obj, Method) and obj.__sklearn_is_fitted__()


def store_arguments(owner: Params, arguments: dict[str, Any]) -> None:
    """Store a constructor's arguments (its `locals()`) under their own names, unchanged, then
    check them (`_check_params`): the one line every constructor ends with."""
    for name in type(owner)._param_names():
        setattr(owner, name, arguments[name])
    owner._check_params()


# heads the section each class's docstring gains from its table (`Params.__init_subclass__`)
ACCEPTED = "Arguments accepted (`parameter_constraints`; checked at construction and at fit):"


class Params:
    """The argument protocol (scikit-learn's): keyword arguments stored as given under their own
    names, one check per argument in `parameter_constraints` (`peg.methods._constraints`;
    a test requires every constructor argument to have one) and the checks between arguments
    in `parameter_rules`, run in that order by `_check_params` at construction, in
    `set_params` and (for a `Method`) at `fit`; `get_params` (nested objects' parameters as
    `name__param` with `deep=True`), `set_params` (`name__param` too) and a `repr` of the
    arguments that differ from their defaults. Every refusal is a `peg.InvalidParameterError`
    (a ValueError and a TypeError), whichever check or rule made it."""

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {}
    parameter_rules: ClassVar[tuple[checks.Rule, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # the docstring's list of what each argument accepts, written from the table itself
        if cls.__doc__ and "parameter_constraints" in cls.__dict__:
            accepted = checks.accepted(cls.parameter_constraints)
            lines = "".join(f"\n        {line}" for line in accepted)
            cls.__doc__ = f"{cls.__doc__.rstrip()}\n\n    {ACCEPTED}{lines}\n"

    def _check_params(self) -> None:
        """`InvalidParameterError` for a bad argument; never change one (clone compares them)."""
        with checks.refusals():
            checks.check_constraints(self, self.parameter_constraints)
            for rule in self.parameter_rules:
                rule(self)

    @classmethod
    def _param_names(cls) -> list[str]:
        signature = inspect.signature(cls.__init__)
        return [
            p.name
            for p in signature.parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor arguments, `{name: value}`; with `deep`, an argument's own parameters
        too, as `name__param` (scikit-learn's protocol)."""
        params = {name: getattr(self, name) for name in self._param_names()}
        if deep:
            for name, value in list(params.items()):
                if isinstance(value, Params):
                    params.update({f"{name}__{k}": v for k, v in value.get_params().items()})
        return params

    def set_params(self, **params: Any) -> Params:
        """Change constructor arguments (`name__param` changes one of an argument's own), checked
        as the constructor checks them (nothing is changed when a check fails); returns self."""
        valid = self._param_names()
        nested: dict[str, dict[str, Any]] = {}
        for key in [k for k in params if "__" in k]:
            name, sub = key.split("__", 1)
            nested.setdefault(name, {})[sub] = params.pop(key)
        unknown = sorted((set(params) | set(nested)) - set(valid))
        if unknown:
            self._refuse_as_constructed({k: params[k] for k in unknown if k in params})
            raise InvalidParameterError(
                f"{type(self).__name__}.set_params: unknown argument(s) {unknown}; valid: {valid}"
            )
        old = {name: getattr(self, name) for name in params}
        for name, value in params.items():
            setattr(self, name, value)
        try:
            for name, sub in nested.items():
                owner = getattr(self, name)
                if not isinstance(owner, Params):
                    raise InvalidParameterError(
                        f"{name}__{next(iter(sub))}: {name} is {owner!r}, which has no "
                        f"parameters of its own; set {name} itself"
                    )
                owner.set_params(**sub)
            self._check_params()
        except Exception:
            for name, value in old.items():
                setattr(self, name, value)
            raise
        return self

    @classmethod
    def _refuse_as_constructed(cls, extra: dict[str, Any]) -> None:
        """The constructor's refusal of an argument it takes under `**kwargs` only to refuse it
        (PEG's `eta_holdout`: saying where it went), so `set_params` and the constructor agree;
        one not naming the argument is left to `set_params`'s error listing the valid names."""
        takes_extra = any(
            p.kind is p.VAR_KEYWORD for p in inspect.signature(cls.__init__).parameters.values()
        )
        for name, value in extra.items() if takes_extra else ():
            try:
                cls(**{name: value})
            except TypeError as e:
                if str(e).startswith(f"{name}:"):
                    raise InvalidParameterError(str(e)) from None

    def _non_defaults(self) -> set[str]:
        """The constructor arguments whose values differ from their defaults."""
        defaults = {
            p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()
        }
        changed = set()
        for name, value in self.get_params(deep=False).items():
            default = defaults.get(name, inspect.Parameter.empty)
            try:
                same = value is default or bool(value == default)
            except Exception:  # e.g. tensors: an ambiguous truth value
                same = False
            if not same:
                changed.add(name)
        return changed

    def __repr__(self) -> str:
        changed = self._non_defaults()
        shown = [f"{k}={v!r}" for k, v in self.get_params(deep=False).items() if k in changed]
        return f"{type(self).__name__}({', '.join(shown)})"


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
        self, X: Data, batch_size: int | None = None, *, batch_fn: BatchFn | None = None,
        **options: Any,
    ) -> Tensor:  # fmt: skip
        """Logits of every member, `[M, N, C]` (the predictor protocol; `progress`, `autocast`,
        `strategy`, `chunk_size` as `Ensemble.member_logits`)."""
        held = self._held()
        size, split = self._reading(batch_size, batch_fn)
        return held.member_logits(X, size, batch_fn=split, **options)

    def iter_member_logits(
        self, X: Data, batch_size: int | None = None, *, batch_fn: BatchFn | None = None,
        **options: Any,
    ) -> Iterator[Tensor]:  # fmt: skip
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
        require_memory("n_members", self.n_members, need, out.device, what,
                       "lower n_members or batch_size")  # fmt: skip

    def __len__(self) -> int:
        self._check_fitted()
        return self.n_members
