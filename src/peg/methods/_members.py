"""How a PEG/PEP ensemble holds its members θ_r + scale · D_r[i]: two implementations, one use.

Both hold the base weights θ_r (`Bases`) and answer the same four questions: how many members
(`len`), the ensemble at a scale (`ensemble_at`), every member's logits at the chosen scale
(`member_logits`), and the members' fingerprints (`fingerprints`, for recipes).

- `StackedMembers` keeps every direction row (`[S, P]` per base): trying another scale costs
  forward passes only, which is what the scale search needs; the members at the chosen scale
  are built once and kept. When the perturbed entries form a head after a fixed trunk
  (`peg._heads`), `search_target` gives the search the trunk's features of the scoring points,
  computed once, and the heads alone at each scale.
- `RegeneratedMembers` (`lazy=True`) holds no member: each prediction builds the members
  `chunk_size` at a time (a `[k, P]` block of rows, the members stacked as views of it),
  predicts every batch with them and frees them, so memory holds the bases, the rows as
  `lazy_store` keeps them (in full, rounded to 16 bits, or none: recomputed, PEG's gradients)
  and one chunk instead of all S·R stacked members (`peg.methods._lazy`).

A `RowSource` computes any subset of one base's rows; the method (PEG or PEP) supplies them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from peg._heads import find_split
from peg._inputs import Data
from peg._params import entry_views, module_like, refresh_bn
from peg._progress import counter
from peg._rows import ValSource
from peg._scalars import check_positive_int
from peg.batches import BatchFn, Tapped, batch_rows, call_model, take_rows
from peg.ensemble import STRATEGIES, Ensemble, Strategy, autocast_dtype
from peg.errors import NotStreamable
from peg.methods.base import FittedEnsemble
from peg.output import logits_of
from peg.recipe import displacement_fingerprints

# Members regenerated at a time by a lazy ensemble when `chunk_size` is not given.
LAZY_CHUNK_SIZE = 5

# what PEG/PEP are fitted around: one model, a list of models, an `Ensemble`, a fitted method
Models = nn.Module | Sequence[nn.Module] | Ensemble

# member indices i (k of them) -> their direction rows D[i], `[k, P]`
RowSource = Callable[[Sequence[int]], Tensor]


def base_models(model: Models) -> list[nn.Module]:
    """One model, a list of models (an ensemble, PEG's Algorithm 2), or an `Ensemble`."""
    if isinstance(model, FittedEnsemble):  # a fitted SWAG, DeepEnsemble, PEG, ...
        model = model.ensemble()
    if isinstance(model, Ensemble):
        return [model.member_model(i) for i in range(len(model))]
    if isinstance(model, nn.Module):
        return [model]
    if (
        isinstance(model, Sequence)
        and len(model) > 0
        and all(isinstance(m, nn.Module) for m in model)
    ):
        return list(model)
    raise TypeError(
        "model: expected an nn.Module, a non-empty list of nn.Modules or a peg.Ensemble, "
        f"got {type(model).__name__}"
    )


@dataclass(frozen=True)
class DirectionData:
    """The validation points that feed the directions, read by index and never gathered:
    points `index` of `source` (a `peg._rows.ValSource`: tensors, a Dataset or a loader's
    dataset), or all of them when `index` is None."""

    source: ValSource
    index: Tensor | None = None

    def __len__(self) -> int:
        return self.source.count if self.index is None else len(self.index)

    @property
    def regression(self) -> bool:
        """Float targets (regression), from the first batch."""
        return self.source.regression

    def rows(self, idx: Tensor) -> tuple[Any, Tensor]:
        """Points `idx` (positions in [0, len(self))): inputs `[B, ...]` (or a mapping of
        them) and labels `[B]`."""
        return self.source.rows(idx if self.index is None else self.index[idx])


def finite_rows(D: Tensor) -> list[bool]:
    """Whether each row of D `[k, P]` is free of NaN and inf."""
    return [bool(torch.isfinite(row).all()) for row in D]


@dataclass
class Bases:
    """What every member is made from: the base weights θ_r and how a row becomes a member.

    Members are numbered base-major (r·S + i); those in `dropped` (non-finite rows) are left
    out everywhere.
    """

    states: list[dict[str, Tensor]]  # θ_r, one state dict per base model
    skeleton: nn.Module  # the architecture (its own weights are not used)
    names: list[str]  # the perturbed entries, in row order
    n_members: int  # S per base
    bn_batches: Iterable[Any] | None = None  # bn="refresh": input batches, read on each pass
    dropped: set[int] = field(default_factory=set)

    def __len__(self) -> int:
        return self.n_members * len(self.states) - len(self.dropped)

    def kept(self, r: int) -> list[int]:
        """Indices i of base r's members that are not dropped."""
        return [i for i in range(self.n_members) if r * self.n_members + i not in self.dropped]

    def chunks(
        self, sources: Sequence[RowSource], k: int
    ) -> Iterator[tuple[int, list[int], Tensor]]:
        """(base r, member indices, their rows `[len(members), P]`), base-major, at most k
        members at a time, leaving out dropped ones. Only one block is held here; the caller
        must drop its reference before asking for the next."""
        for r, source in enumerate(sources):
            kept = self.kept(r)
            for start in range(0, len(kept), k):
                members = kept[start : start + k]
                with torch.enable_grad():  # PEG's rows are gradients, even under no_grad()
                    D = source(members)
                yield r, members, D
                del D

    def head(self, x: Any) -> str | None:
        """The module holding every perturbed entry after a trunk the members share (run once
        per batch: `peg._heads`), checked on inputs `x`; None when every member runs whole."""
        if self.bn_batches is not None:  # per-member BatchNorm statistics: no shared trunk
            return None
        split = find_split(self.skeleton, set(self.names), self.states, x)
        if split is None:
            return None
        if split.prefix:
            return split.prefix[:-1]
        paths = [n.split(".")[:-1] for n in self.names]  # a Sequential's tail: the module
        same = itertools.takewhile(lambda p: len(set(p)) == 1, zip(*paths, strict=False))
        common = [p[0] for p in same]  # holding them all, else the tail's first child
        return ".".join(common) or next(iter(split.head._modules))

    def base_ensemble(self) -> Ensemble:
        """The base models as an `Ensemble` (scale 0 of every member; BatchNorm statistics
        re-estimated when the members' are)."""
        states = self.states
        if self.bn_batches is not None:
            states = [refresh_bn(self.skeleton, dict(s), self.bn_batches) for s in states]
        return Ensemble.from_state_dicts(self.skeleton, states)

    def ensemble(self, directions: Sequence[Tensor], scale: float) -> Ensemble:
        """Members θ_r + scale·D_r[i] for every base r (D_r `[S, P]`), base-major, but the
        dropped ones, from one state dict per member."""
        shapes = [self.states[0][n].shape for n in self.names]
        states = []
        for r, (base, D) in enumerate(zip(self.states, directions, strict=True)):
            steps = entry_views(scale * D, shapes)  # per parameter: [S, *shape]
            for i in range(D.shape[0]):
                if r * D.shape[0] + i in self.dropped:
                    continue
                state = dict(base)
                for n, step in zip(self.names, steps, strict=True):
                    state[n] = base[n] + step[i].to(base[n].dtype)
                if self.bn_batches is not None:
                    state = refresh_bn(self.skeleton, state, self.bn_batches)
                states.append(state)
        return Ensemble.from_state_dicts(self.skeleton, states)


@dataclass(frozen=True)
class SearchTarget:
    """What the scale search scores: the members at a scale (`at`) on `inputs` (the scoring
    points, or a fixed trunk's features of them); `bases()` holds one member per base model
    at scale 0 (the bases themselves), `member_base[j]` the base of member j."""

    at: Callable[[float], Ensemble]
    inputs: Any  # a tensor [N, ...] or a mapping of them
    bases: Callable[[], Ensemble]
    member_base: list[int]


def _check_scale(scale: Any) -> None:
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale: expected a finite number >= 0, got {scale!r}")


class StackedMembers:
    """Every direction row held (`[S, P]` per base); the members at one scale built once."""

    def __init__(self, bases: Bases, directions: list[Tensor]) -> None:
        self.bases, self.directions = bases, directions
        self._built: tuple[float, Ensemble] | None = None

    def __len__(self) -> int:
        return len(self.bases)

    def ensemble_at(self, scale: float) -> Ensemble:
        """The members at `scale`, built anew (the search's, `ensemble_at`'s)."""
        _check_scale(scale)
        return self.bases.ensemble(self.directions, scale)

    def ensemble(self, scale: float) -> Ensemble:
        """The members at `scale`, kept: the fitted ensemble."""
        if self._built is None or self._built[0] != scale:
            self._built = (scale, self.ensemble_at(scale))
        return self._built[1]

    def member_logits(self, X: Data, scale: float, batch_size: int, **kwargs: Any) -> Tensor:
        return self.ensemble(scale).member_logits(X, batch_size, **kwargs)

    def iter_member_logits(
        self, X: Data, scale: float, batch_size: int, **kwargs: Any
    ) -> Iterator[Tensor]:
        return self.ensemble(scale).iter_member_logits(X, batch_size, **kwargs)

    @torch.no_grad()
    def search_target(self, X: Any, batch_size: int) -> SearchTarget:
        """What the scale search scores (`SearchTarget`).

        With one base, no per-member BatchNorm statistics, and the perturbed entries in a head
        after a fixed trunk (`peg._heads.find_split`, checked on X): the heads alone at each
        scale (the members' head entries, computed as `ensemble_at`'s), and the trunk's
        features of X, computed once, `batch_size` rows at a time. Otherwise `ensemble_at`
        and X themselves.
        """
        bases = self.bases
        member_base = [r for r in range(len(bases.states)) for _ in bases.kept(r)]
        split = None
        if len(bases.states) == 1 and bases.bn_batches is None:
            split = find_split(bases.skeleton, set(bases.names), bases.states, X)
        if split is None:
            return SearchTarget(self.ensemble_at, X, bases.base_ensemble, member_base)
        base, D = bases.states[0], self.directions[0]
        trunk = split.trunk_module(base)
        rows = batch_rows(X, "val")  # X: a tensor or a mapping of them (dict batches)
        features = torch.cat(
            [
                logits_of(call_model(trunk, take_rows(X, a, a + batch_size)))
                for a in range(0, rows, batch_size)
            ]
        )
        kept = torch.tensor(bases.kept(0), device=D.device)
        shapes = [base[n].shape for n in bases.names]

        def heads_at(scale: float) -> Ensemble:
            _check_scale(scale)
            steps = entry_views(scale * D.index_select(0, kept), shapes)  # [k, *shape] each
            stacked = {
                n: base[n] + step.to(base[n].dtype)
                for n, step in zip(bases.names, steps, strict=True)
            }
            shared = {k: v for k, v in base.items() if k not in stacked}
            return Ensemble(split.head, split.head_entries(stacked), split.head_entries(shared))

        return SearchTarget(heads_at, features, lambda: heads_at(0.0).subset([0]), member_base)

    def fingerprints(self, scale: float) -> list[list[float]]:
        return displacement_fingerprints(self.directions, scale)


class RegeneratedMembers:
    """No member held: the rows of a chunk of members are read from `stored` or recomputed by
    `sources()` whenever members are needed (`lazy_store`, `peg.methods._lazy`).

    `skeleton` runs on the meta device (no memory); `fingerprints` are every member's, taken
    from the full-precision rows during `fit`. With `stored` rows, predicting reads each
    parameter's entries of a chunk straight from them (`entries(members)`, `[k, *shape]`,
    contiguous, as the eager ensemble's stacked weights are), never a `[k, P]` block.
    """

    def __init__(
        self,
        bases: Bases,
        sources: Callable[[], list[RowSource]],
        fingerprints: list[list[float]],
        stored: Sequence[Any] | None = None,
    ) -> None:
        self.bases, self.sources, self._fingerprints = bases, sources, fingerprints
        self.stored = stored  # the rows kept (`peg.methods._lazy.StoredRows`, one per base)
        self.skeleton = _meta_like(bases.skeleton, bases.states[0])

    def __len__(self) -> int:
        return len(self.bases)

    def ensemble_at(self, scale: float) -> Ensemble:
        """Every member at `scale` (S·R × member size of memory), from its rows."""
        _check_scale(scale)
        with torch.enable_grad():
            directions = [source(range(self.bases.n_members)) for source in self.sources()]
        return self.bases.ensemble(directions, scale)

    ensemble = ensemble_at  # nothing is kept: each call builds every member

    def fingerprints(self, scale: float) -> list[list[float]]:
        """Every member's fingerprint (`displacement_fingerprints`; NaN for dropped ones) at the
        scale `fit` chose (`scale` is that one), taken by `fit`."""
        return self._fingerprints

    def _chunks(self, k: int, scale: float) -> Iterator[tuple[list[int], Ensemble]]:
        """(members, their `Ensemble`), base-major, at most k at a time, dropped ones left out:
        from the stored rows' entries, or from rows regenerated. A chunk is let go before the
        next is built, once the caller has dropped it too."""
        if self.stored is None or self.bases.bn_batches is not None:
            for r, members, D in self.bases.chunks(self.sources(), k):
                chunk = self._chunk_ensemble(r, D, scale)
                del D
                yield members, chunk
                del chunk
            return
        for r, stored in enumerate(self.stored):
            kept = self.bases.kept(r)
            for start in range(0, len(kept), k):
                members = kept[start : start + k]
                chunk = self._stack(r, stored.entries(members), scale)
                yield members, chunk
                del chunk

    def _chunk_ensemble(self, r: int, D: Tensor, scale: float) -> Ensemble:
        """Members θ_r + scale·D[j] of base r as an `Ensemble` of len(D) members: D `[k, P]` is
        consumed (`_stack` of its views: nothing of size k·P is allocated)."""
        base, names = self.bases.states[r], self.bases.names
        if self.bases.bn_batches is not None:
            one = Bases([base], self.bases.skeleton, names, len(D), self.bases.bn_batches)
            return one.ensemble([D], scale)
        return self._stack(r, entry_views(D, [base[n].shape for n in names]), scale)

    def _stack(self, r: int, entries: list[Tensor], scale: float) -> Ensemble:
        """Members θ_r + scale·entries of base r (one `[k, *shape]` per perturbed parameter,
        consumed: scaled and shifted in place), the skeleton on the meta device. The same
        arithmetic as `Bases.ensemble`, so the same weights bit for bit."""
        base, names = self.bases.states[r], self.bases.names
        stacked = {
            n: e.mul_(scale).to(base[n].dtype).add_(base[n])
            for n, e in zip(names, entries, strict=True)
        }
        shared = {k: v for k, v in base.items() if k not in stacked}
        return Ensemble(self.skeleton, stacked, shared)

    def iter_member_logits(self, *_: Any, **__: Any) -> Iterator[Tensor]:
        """Never: every batch needs every chunk of members, regenerated (see `member_logits`)."""
        raise NotStreamable(
            "a lazy ensemble regenerates chunks of members outside its batches: it cannot give "
            "the members of one batch at a time without regenerating every chunk per batch; use "
            "member_logits"
        )

    @torch.no_grad()
    def member_logits(
        self,
        X: Data,
        scale: float,
        batch_size: int = 512,
        strategy: Strategy = "auto",
        progress: bool | None = None,
        chunk_size: int | None = None,
        autocast: str | torch.dtype | None = None,
    ) -> Tensor:
        """Logits `[M, N, C]`: chunks of `chunk_size` members (default `LAZY_CHUNK_SIZE`)
        outside, batches inside. A chunk is regenerated, predicts every batch of X (`strategy`
        within the chunk), and is freed. A Dataset or DataLoader is read once per chunk, never
        gathered (⌈M / chunk_size⌉ passes over it: cheap next to the forward passes when the
        data is in memory, a cost to weigh when each item is loaded or made anew); it must
        yield the same rows on every pass (no shuffling), which is checked by their number."""
        autocast_dtype(autocast)  # checked before any member is built
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
        batch_size = check_positive_int(batch_size, "batch_size")
        k = LAZY_CHUNK_SIZE if chunk_size is None else check_positive_int(chunk_size, "chunk_size")
        if isinstance(X, Tapped):  # records labels: only on the first pass
            later: tuple[Data, BatchFn | None] = (X.data, X.batch_fn)
        else:
            later = (X, None)
        M = len(self)
        out: Tensor | None = None
        start = 0
        shown = counter(f"predict ({M} members, {k} at a time)", progress)
        # no bar around the chunks: its iterator would hold the last chunk while making the next
        # (`_chunks` lets go of one when asked for the next, after `del ensemble` here)
        for members, ensemble in self._chunks(k, scale):
            shown.update(len(members))
            data, fn = (X, None) if out is None else later
            logits = ensemble.member_logits(
                data, batch_size, strategy, False, len(members), autocast, batch_fn=fn
            )
            del ensemble
            if out is None:
                out = logits.new_empty((M, *logits.shape[1:]))
            elif logits.shape[1:] != out.shape[1:]:
                raise ValueError(
                    f"X: {out.shape[1]} rows on the first pass, {logits.shape[1]} on a later one; "
                    "a lazy ensemble reads X once per chunk of members: pass data that yields "
                    "the same rows on every pass (no shuffling)"
                )
            out[start : start + len(members)] = logits
            start += len(members)
            del logits
        shown.close()
        assert out is not None and start == M
        return out


def _meta_like(skeleton: nn.Module, state: dict[str, Tensor]) -> nn.Module:
    """A copy of `skeleton` with meta-device tensors: structure without memory."""
    return module_like(skeleton, {k: torch.empty_like(v, device="meta") for k, v in state.items()})
