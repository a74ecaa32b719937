"""`Ensemble`: one module skeleton and the stacked weights of its M members.

Every method in the library ends here (or in something with the same `member_logits`
interface), so metrics, benchmarks and plots never need to know which method made an ensemble.

Storage: state-dict entries that differ between members are kept stacked, `[M, *shape]`;
entries equal in every member (frozen parameters, BatchNorm statistics left untouched by PEG)
are kept once. Prediction runs the skeleton with `torch.func.functional_call` on each member's
weights, always in eval mode (BatchNorm uses its running statistics, dropout is off); how the
members run on a batch is `peg.runtime.strategies` (`MemberStrategies`), and which way "auto" picks,
`peg.runtime.auto_strategy`. What every predictor derives from its `member_logits` (`Predicts`) is
`peg.runtime.predicts`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from peg import archive
from peg._forward import training_modules
from peg._params import laid_out_like
from peg._wrappers import archived_meta
from peg.output import model_output
from peg.runtime.auto_strategy import AUTO_VECTORISE_FLOPS as AUTO_VECTORISE_FLOPS
from peg.runtime.auto_strategy import AUTO_VECTORISE_FLOPS_CONV as AUTO_VECTORISE_FLOPS_CONV
from peg.runtime.auto_strategy import AUTO_VECTORISE_ROWS_CONV as AUTO_VECTORISE_ROWS_CONV
from peg.runtime.predicts import Predicts, _cat_batches, autocast_dtype
from peg.runtime.strategies import STRATEGIES, MemberStrategies, Strategy, call_key
from peg.source import Data, Source
from peg.source._devices import move
from peg.source.batches import BatchFn, check_batch_fn
from peg.utils.progress import bar
from peg.utils.scalars import check_positive_int

__all__ = ["Ensemble", "Predicts", "autocast_dtype", "model_output"]


def _check_same_architecture(states: Sequence[Mapping[str, Tensor]]) -> None:
    """Every member state dict has the names and shapes of the first (one architecture)."""
    first = {k: tuple(v.shape) for k, v in states[0].items()}
    for i, state in enumerate(states[1:], 1):
        got = {k: tuple(v.shape) for k, v in state.items()}
        if got != first:
            diff = sorted(k for k in first.keys() | got.keys() if first.get(k) != got.get(k))
            raise ValueError(
                f"states: member {i} is not the architecture of member 0 (entries differing in "
                f"name or shape: {diff[:5]}); an Ensemble's members share one architecture"
            )


def _stack_states(
    states: Sequence[Mapping[str, Tensor]],
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(stacked, shared) entries of member state dicts: those identical in every member once."""
    if len(states) == 0:
        raise ValueError("states: expected at least one member state dict")
    _check_same_architecture(states)
    stacked, shared = {}, {}
    for name in states[0]:
        values = [s[name].detach() for s in states]
        if all(torch.equal(values[0], v) for v in values[1:]):
            shared[name] = values[0].clone()
        else:
            stacked[name] = torch.stack(values)
    if not stacked:  # all members identical: still keep M copies of one entry to record M
        name = next(iter(shared))
        stacked[name] = shared.pop(name).unsqueeze(0).repeat_interleave(len(states), 0)
    return stacked, shared


class Ensemble(Predicts, MemberStrategies):
    """M members of one architecture, predicted with one skeleton module.

    Args:
        skeleton: the architecture; its own weights are never used for predictions (they are
            replaced member by member), but it is deep-copied so later edits of the caller's
            module do not leak in.
        stacked: state-dict entries that differ between members, each `[M, *shape]`.
        shared: state-dict entries common to all members, each `[*shape]`.
        meta: JSON-serialisable description (method, hyper-parameters, seed, ...), saved with it.
    """

    def __init__(
        self,
        skeleton: nn.Module,
        stacked: Mapping[str, Tensor],
        shared: Mapping[str, Tensor] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if not stacked:
            raise ValueError("stacked: an ensemble needs at least one per-member entry")
        sizes = {int(t.shape[0]) for t in stacked.values()}
        if len(sizes) != 1:
            raise ValueError(f"stacked: entries disagree on the number of members: {sorted(sizes)}")
        self._hold(copy.deepcopy(skeleton).eval(), stacked, shared, meta)

    @classmethod
    def _sharing(
        cls,
        skeleton: nn.Module,
        stacked: Mapping[str, Tensor] | None = None,
        shared: Mapping[str, Tensor] | None = None,
        states: Sequence[Mapping[str, Tensor]] | None = None,
    ) -> Ensemble:
        """An ensemble on `skeleton` itself, not a copy: for the short-lived ensembles a fit
        builds (a scale search's, one per scale), on a skeleton the fit owns, in eval mode, that
        nothing edits. A deep copy per ensemble cost PEG-15's fit about one temperature scaling
        fit (docs/performance.md, the fit's profile). Given `states`, they are stacked as
        `from_state_dicts` stacks them."""
        if states is not None:
            stacked, shared = _stack_states(states)
        ensemble = cls.__new__(cls)
        ensemble._hold(skeleton, stacked or {}, shared, None)
        ensemble._transient = True  # a few batches: the loop swaps tensors, builds no modules
        return ensemble

    def _hold(
        self,
        skeleton: nn.Module,
        stacked: Mapping[str, Tensor],
        shared: Mapping[str, Tensor] | None,
        meta: Mapping[str, Any] | None,
    ) -> None:
        """Keep the skeleton (as given) and the entries, checked against its state dict."""
        self.skeleton = skeleton
        own = self.skeleton.state_dict()
        self.stacked = {k: laid_out_like(v.detach(), own.get(k)) for k, v in stacked.items()}
        self.shared = {k: v.detach() for k, v in (shared or {}).items()}
        expected = set(own)
        got = set(self.stacked) | set(self.shared)
        if got != expected:
            missing, extra = sorted(expected - got), sorted(got - expected)
            raise ValueError(
                f"stacked/shared: entries do not match the skeleton's state dict "
                f"(missing {missing[:5]}, unexpected {extra[:5]})"
            )
        self.meta: dict[str, Any] = dict(meta or {})

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_state_dicts(
        cls,
        skeleton: nn.Module,
        states: Sequence[Mapping[str, Tensor]],
        meta: Mapping[str, Any] | None = None,
    ) -> Ensemble:
        """Stack member state dicts; entries identical in every member are stored once."""
        return cls(skeleton, *_stack_states(states), meta)

    @classmethod
    def from_models(
        cls, models: Sequence[nn.Module], meta: Mapping[str, Any] | None = None
    ) -> Ensemble:
        """An ensemble of already-trained models of one architecture (e.g. a deep ensemble)."""
        if len(models) == 0:
            raise ValueError("models: expected at least one model")
        bad = [i for i, m in enumerate(models) if not isinstance(m, nn.Module)]
        if bad:
            raise TypeError(
                f"models: expected nn.Modules, got {type(models[bad[0]]).__name__} at {bad[0]}"
            )
        try:
            return cls.from_state_dicts(models[0], [m.state_dict() for m in models], meta)
        except ValueError as e:
            raise ValueError(str(e).replace("states:", "models:", 1)) from None

    # ---------------------------------------------------------------- members
    def __len__(self) -> int:
        return int(next(iter(self.stacked.values())).shape[0])

    @property
    def device(self) -> torch.device:
        """The device the members' weights are on (`to(device)` moves them)."""
        return next(iter(self.stacked.values())).device

    def member_state(self, i: int) -> dict[str, Tensor]:
        """The full state dict of member `i` (views, not copies)."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"i: member index {i} out of range for {len(self)} members")
        return {**self.shared, **{k: v[i] for k, v in self.stacked.items()}}

    def member_model(self, i: int) -> nn.Module:
        """A standalone copy of the skeleton carrying member `i`'s weights (eval mode)."""
        model = copy.deepcopy(self.skeleton)
        model.load_state_dict({k: v.clone() for k, v in self.member_state(i).items()})
        return model.eval()

    def subset(self, indices: Sequence[int]) -> Ensemble:
        """Members `indices` (in that order) as an ensemble of their own: `[len(indices), ...]`
        stacked entries (copies), the same shared entries, skeleton and meta."""
        index = [int(i) for i in indices]
        if not index:
            raise ValueError("indices: expected at least one member index")
        bad = [i for i in index if not -len(self) <= i < len(self)]
        if bad:
            raise IndexError(f"indices: member index {bad[0]} out of range for {len(self)} members")
        picked = torch.tensor(index, device=self.device)
        stacked = {k: v.index_select(0, picked) for k, v in self.stacked.items()}
        return Ensemble(self.skeleton, stacked, self.shared, self.meta)

    def to(self, device: torch.device | str) -> Ensemble:
        """Move the skeleton and every member to `device` (in place); returns self."""
        self.skeleton.to(device)
        self.stacked = {k: v.to(device) for k, v in self.stacked.items()}
        self.shared = {k: v.to(device) for k, v in self.shared.items()}
        return self

    # ---------------------------------------------------------------- prediction
    def member_logits(
        self,
        X: Data,
        batch_size: int | None = None,
        strategy: Strategy = "auto",
        progress: bool | None = None,
        chunk_size: int | None = None,
        autocast: str | torch.dtype | None = None,
        batch_fn: BatchFn | None = None,
    ) -> Tensor:
        """Logits of every member, `[M, N, C]`.

        Args:
            X: inputs `[N, ...]` (Tensor or array), a mapping of them, or a Dataset/DataLoader
                yielding `x`, `(x, y, ...)` or mapping batches (`peg.source.batches`: a mapping's
                entries but "labels"/"label" are the model's keyword inputs, `model(**inputs)`),
                on any device: each batch is moved to the members' device, recursively
                (`peg.source._devices.model_device` gives the rule; `meta` data is refused).
                Inputs the model cannot run on get an error naming X, from two of their rows.
            batch_size: rows per forward pass when X is a tensor (None: 512).
            strategy: "loop" runs members one after another on each batch; "vmap" runs all of
                them in one vectorised call (`torch.func.vmap` over the stacked weights);
                "folded" runs them as one model whose batch holds every member's rows
                (`peg.runtime.folded`: Linear, Conv, BatchNorm/LayerNorm/GroupNorm layers; fastest
                at small batches); "chunked" vectorises (vmap) over `chunk_size` members at a
                time, bounding memory; "auto" (default) vectorises batches whose forward
                costs at most `AUTO_VECTORISE_FLOPS` per member (`AUTO_VECTORISE_FLOPS_CONV`
                with convolutions; folded where it agrees with `functional_call`, else vmap)
                and loops over larger ones (see `_choose`; a model vmap cannot run is looped).
            progress: show a progress bar (None: only on a terminal).
            chunk_size: members per vectorised call for "chunked" (and for "auto").
            autocast: run the forward passes under `torch.autocast` in "bf16" / "fp16" (or
                `torch.bfloat16` / `torch.float16`) on the members' device: faster on GPUs
                with tensor cores, at that precision (bf16 keeps 8 bits of mantissa: logits
                within ~1% of float32). The logits come back as float32. None (default): the
                weights' own precision.
            batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape
                (`peg.source.batches`); None: the conventions above.
        """
        key = call_key(X, strategy, batch_size, chunk_size, autocast, batch_fn)
        if (modules := self._ready_again(key)) is not None:  # as the last call: nothing to check
            return self._run_ready(modules, X)
        amp, batch_size, chunk_size = self._options(strategy, batch_size, chunk_size, autocast)
        if isinstance(X, Tensor) and batch_fn is None and X.ndim and 0 < len(X) <= batch_size:
            # one batch, as `iter_member_logits` would yield it, without its generators and
            # progress bar (docs/performance.md, member_logits' per-call cost)
            x = move(X, self.device, "X")
            modules = None if amp is not None else self._ready_loop(x, strategy, key, x is X)
            if modules is not None:  # the loop, all decided: the member modules and no more
                return self._run_ready(modules, x)
            with torch.no_grad(), self._eval():
                logits = self._one(x, strategy, amp, chunk_size)
            return logits.contiguous()
        return _cat_batches(
            self.iter_member_logits(
                X, batch_size, strategy, progress, chunk_size, autocast, batch_fn
            )
        )

    @torch.no_grad()
    def iter_member_logits(
        self,
        X: Data,
        batch_size: int | None = None,
        strategy: Strategy = "auto",
        progress: bool | None = None,
        chunk_size: int | None = None,
        autocast: str | torch.dtype | None = None,
        batch_fn: BatchFn | None = None,
    ) -> Iterator[Tensor]:
        """`member_logits` batch by batch: `[M, B_j, C]` for batch j of X, in order (arguments
        as `member_logits`, which concatenates them: the same batches, the same bits). Holds one
        batch's logits at a time (`peg.evaluate` streams its metrics from it)."""
        amp, batch_size, chunk_size = self._options(strategy, batch_size, chunk_size, autocast)
        batch_fn = check_batch_fn(batch_fn)
        seen = False
        with self._eval():
            source = Source.of(X, batch_fn)
            for x in bar(
                source.inputs(batch_size, self.device),
                f"predict ({len(self)} members)",
                total=source.num_batches(batch_size),
                enabled=progress,
            ):
                seen = True
                yield self._one(x, strategy, amp, chunk_size)
        if not seen:
            raise ValueError("X: no inputs to predict (0 samples)")

    def _options(
        self,
        strategy: Strategy,
        batch_size: int | None,
        chunk_size: int | None,
        autocast: str | torch.dtype | None,
    ) -> tuple[torch.dtype | None, int, int | None]:
        """The prediction options checked: (autocast dtype, batch size, chunk size)."""
        amp = autocast_dtype(autocast)
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
        batch_size = check_positive_int(512 if batch_size is None else batch_size, "batch_size")
        if self.device.type == "meta":
            raise ValueError(
                "ensemble: its weights are on the meta device (shapes without values); "
                "load or build it with real weights"
            )
        if chunk_size is not None:
            chunk_size = check_positive_int(chunk_size, "chunk_size")
        elif strategy == "chunked":
            raise ValueError("chunk_size: strategy='chunked' needs chunk_size (members per call)")
        return amp, batch_size, chunk_size

    @contextlib.contextmanager
    def _eval(self) -> Iterator[None]:
        """The skeleton's modules in eval mode inside the block (cheaper than eval() and back)."""
        training = training_modules(self.skeleton)
        for m in training:
            m.training = False
        try:
            yield
        finally:
            for m in training:
                m.training = True

    def _one(
        self, x: Any, strategy: Strategy, amp: torch.dtype | None, chunk_size: int | None
    ) -> Tensor:
        """Every member's logits `[M, B, C]` on one batch `x` (on the members' device)."""
        chosen = self._choose(x, chunk_size) if strategy == "auto" else strategy
        if amp is None:
            return self._predict(x, chosen, strategy == "auto", chunk_size)
        with torch.autocast(self.device.type, dtype=amp):
            logits = self._predict(x, chosen, strategy == "auto", chunk_size)
        return logits.float()

    # ---------------------------------------------------------------- persistence
    def save(self, path: str) -> str:
        """Write the ensemble to `path` (safetensors + JSON header; atomic). Returns the path.
        A skeleton wrapping the user's model (a chained base: "TS → PEG") is recorded in the
        meta (`peg._wrappers`), so the archive loads with the model itself."""
        arch = type(self.skeleton).__name__
        meta = archived_meta(self.meta, self.skeleton)
        return archive.write(path, self.stacked, self.shared, meta, arch)

    def __repr__(self) -> str:
        method = self.meta.get("method", "?")
        return (
            f"Ensemble(method={method!r}, members={len(self)}, "
            f"architecture={type(self.skeleton).__name__})"
        )
