"""The fixed rule by which `strategy="auto"` picks how an `Ensemble` runs its members on a batch
(`AutoStrategy`, a part of `peg.runtime.strategies.MemberStrategies`): loop a batch whose forward
costs more than `AUTO_VECTORISE_FLOPS` per member, else fold the members into the batch where that
agrees with `functional_call`, else vmap; what it counted, and what failed on an architecture,
remembered per process. Never a timing: the same choice on every run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from peg.runtime.heads import architecture
from peg.source.batches import batch_rows, signature, take_rows

# "auto" vectorises a batch while one member's forward on it costs at most this many FLOPs
# (matmuls and convolutions, counted once per architecture and input shape), and always up to
# AUTO_VECTORISE_ROWS_CONV rows with convolutions; larger batches are looped: where vectorising
# stopped paying on one CPU thread (an MLP 784-256-256 at ~64 rows, ResNet-20 between 4 and 8;
# docs/performance.md, "Inference"). Convolutions stop paying sooner,
# AUTO_VECTORISE_FLOPS_CONV: the folded grouped convolutions write M-fold activations, and a
# loop's per-member convolutions use two threads well (docs/performance.md, "Against a plain
# loop over separate modules").
AUTO_VECTORISE_FLOPS = 6.4e7
AUTO_VECTORISE_FLOPS_CONV = 2e7
AUTO_VECTORISE_ROWS_CONV = 4
_FLOPS: dict[tuple[Any, ...], tuple[int, bool]] = {}  # (architecture, row shape) -> FLOP/row, conv
_NOT_VMAPPABLE: set[tuple[str, str, str]] = set()  # architectures vmap failed on (this process)
# (architecture, per-member entries) -> whether folding agreed with functional_call (this process)
_FOLDS: dict[tuple[Any, ...], bool] = {}


def _vectorises(n: int, per_row: int, conv: bool) -> bool:
    """Whether "auto" vectorises `n` rows of a forward costing `per_row` FLOPs a row (`conv`:
    the architecture has convolutions; see `AutoStrategy._choose`)."""
    if conv:
        return n <= AUTO_VECTORISE_ROWS_CONV or n * per_row <= AUTO_VECTORISE_FLOPS_CONV
    return n * per_row <= AUTO_VECTORISE_FLOPS


class AutoStrategy:
    """The choice "auto" makes for a batch, and what it remembers. Mixed into
    `MemberStrategies`, whose `skeleton`, `stacked`, `__len__` and members' runs (below) it uses.
    """

    skeleton: nn.Module
    stacked: dict[str, Tensor]
    # `MemberStrategies`' own: the shared trunk (if any), one member's logits, a clear error for
    # bad inputs, every member's logits with a concrete strategy
    _heads: Callable[[Any], Any]
    _member_output: Callable[[int, Any], Tensor]
    _diagnose: Callable[[Any], None]
    _batch_logits: Callable[[Any, str, int | None], Tensor]

    def _choose(self, x: Any, chunk_size: int | None) -> str:
        """The strategy "auto" uses for a batch: a fixed rule, so results never depend on timing.

        Small batches are dominated by Python overhead per member and layer, which vectorising
        removes; large ones are compute-bound, where the loop avoids the M-fold activations.
        Where that turns is measured in FLOPs of one member's forward on the batch
        (`AUTO_VECTORISE_FLOPS`; with convolutions `AUTO_VECTORISE_FLOPS_CONV`, and a few rows
        are vectorised whatever their cost, `AUTO_VECTORISE_ROWS_CONV`).
        Vectorising means folding the members into the batch (`peg.runtime.folded`) where that
        agrees with `functional_call` (checked once per architecture), vmap otherwise, or vmap
        over `chunk_size` members. A model vmap cannot run is remembered and looped.
        """
        if self._heads(x) is not None:
            return "auto"  # the heads' choice, made by `_predict` on the trunk's features
        if self._loops_arch() or not self._small(x):
            return "loop"
        if chunk_size is not None:
            return "chunked"
        return "folded" if self._folds(x) else "vmap"

    def _loops_arch(self) -> bool:
        """Whether "auto" loops whatever the batch: one member, or an architecture vmap
        failed on in this process (its verdict kept under `architecture`, as `_predict` adds it;
        the class name alone, tested before, never matched, so every call tried vmap again)."""
        return len(self) == 1 or (
            bool(_NOT_VMAPPABLE) and architecture(self.skeleton) in _NOT_VMAPPABLE
        )

    def _small(self, x: Any) -> bool:
        """Whether the batch `x` is small enough to vectorise (see `_choose`)."""
        key = (*self._fold_key, signature(x))
        n = batch_rows(x)
        if key not in _FLOPS:
            counter = FlopCounterMode(display=False)
            rows = take_rows(x, 0, 2)  # 2: BatchNorm on batch stats
            try:
                with counter:
                    self._member_output(0, rows)
            except Exception:
                self._diagnose(x)  # bad inputs: their own clear error
                raise
            conv = any(isinstance(m, nn.modules.conv._ConvNd) for m in self.skeleton.modules())
            _FLOPS[key] = (counter.get_total_flops() // min(n, 2), conv)
        return _vectorises(n, *_FLOPS[key])

    def _folds(self, x: Any) -> bool:
        """Whether folding gives members 0 and M-1 their `functional_call` logits on `x`.

        Asked once per (architecture, per-member entries) and process: a forward that mixes
        rows, or a layer without a folded form, makes "auto" use vmap instead. Structured
        inputs (a mapping) are never folded.
        """
        if not isinstance(x, Tensor):
            return False
        key = self._fold_key
        if key not in _FOLDS:
            ends = [0, len(self) - 1]
            try:
                reference = torch.stack([self._member_output(i, x) for i in ends])
            except Exception:
                self._diagnose(x)  # bad inputs: their own clear error
                raise
            try:  # the members run: any failure of the folded model is folding's own
                got = self._batch_logits(x, "folded", None)[ends]
                _FOLDS[key] = got.shape == reference.shape and torch.allclose(
                    got, reference, rtol=1e-4, atol=1e-5
                )
            except Exception:  # e.g. a forward reading `self.fc.weight`, which folding replaced
                _FOLDS[key] = False
        return _FOLDS[key]

    @functools.cached_property
    def _fold_key(self) -> tuple[Any, ...]:
        """What folding depends on: the architecture and which entries are per member."""
        return *architecture(self.skeleton), frozenset(self.stacked)

    def _known_to_loop(self, x: Any) -> bool:
        """Whether "auto" loops on the batch `x` by what is known already, without running the
        model: an architecture it loops whatever the batch, or `x`'s FLOPs counted before."""
        if self._loops_arch():
            return True
        known = _FLOPS.get((*self._fold_key, signature(x)))
        return known is not None and not _vectorises(batch_rows(x), *known)

    def _failed(self, chosen: str) -> str:
        """Remember (this process) that the vectorised strategy `chosen` failed on this
        architecture; the strategy to try next: folded → vmap → loop."""
        arch = architecture(self.skeleton)
        if chosen == "folded":
            _FOLDS[self._fold_key] = False
            return "loop" if arch in _NOT_VMAPPABLE else "vmap"
        _NOT_VMAPPABLE.add(arch)  # e.g. .item() inside
        return "loop"
