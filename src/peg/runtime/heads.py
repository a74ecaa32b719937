"""Trunk and head: `model(x) = head(trunk(x))`, every per-member entry in the head.

When an ensemble's members differ only in the last layer(s) (last-layer PEG, `params=["fc"]`),
the trunk is the same for every member: it runs once per batch and only the heads run per
member, in prediction (`peg.runtime.strategies`) and in the scale search
(`peg.methods.perturbation._members`).

`find_split(skeleton, per_member, states, x)` returns such a `Split`, or None. The candidates,
in this order (`candidates`):

1. a head the model declares: `model.peg_head = "fc"` (a module name; any `nn.Module` accepts
   the attribute), for a model where the rule below does not find it;
2. an `nn.Sequential`: the longest prefix of its children holding no per-member entry is the
   trunk, the remaining children the head;
3. the modules holding every per-member entry, the deepest first (never the model itself):
   the head is that module, the trunk the model with it replaced by `nn.Identity`.

A candidate's trunk holds no per-member entry but some shared ones (weights worth sharing), and
its head every per-member entry. Whether the forward
really is trunk-then-head (a head applied last, once, to the trunk's output) is checked once per
architecture and set of per-member entries, like the fold check: the split's logits must match
the model's own on two rows of `x` for each of `states`. A model that fails every check (a skip
connection around the head, an output computed after it, ...) gets None: everything still works,
without the shortcut.
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from peg._forward import training_modules
from peg._params import module_like
from peg.output import logits_of, model_output
from peg.source.batches import batch_rows, call_functional, take_rows

# (architecture, declared head, per-member entries) -> the candidate that passed the check, or None
_SPLITS: dict[tuple[Any, ...], int | None] = {}


@dataclass(frozen=True)
class Split:
    """`model = head ∘ trunk`: modules whose own tensors are never used (state dicts are given).

    A head entry named `prefix + local` in the model is `local` in the head's state dict.
    """

    trunk: nn.Module
    head: nn.Module
    prefix: str
    trunk_names: frozenset[str]
    head_names: frozenset[str]

    def head_entries(self, entries: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The head's entries among `entries` (model names), under the head's own names."""
        n = len(self.prefix)
        return {k[n:]: v for k, v in entries.items() if k in self.head_names}

    def trunk_module(self, state: Mapping[str, Tensor]) -> nn.Module:
        """The trunk running the tensors of `state` (not copied), in eval mode."""
        return module_like(self.trunk, {k: state[k] for k in self.trunk_names}).eval()

    def logits(self, state: Mapping[str, Tensor], x: Any) -> Tensor:
        """The model's logits on `x` through the split (the check's)."""
        trunk = {k: state[k] for k in self.trunk_names}
        features = logits_of(call_functional(self.trunk, trunk, x))
        out = functional_call(self.head, self.head_entries(state), (features,))
        return model_output(out, "member_logits", shaped=True)


def _split(trunk: nn.Module, head: nn.Module, prefix: str, per_member: set[str]) -> Split | None:
    trunk_names = frozenset(trunk.state_dict())
    head_names = frozenset(prefix + k for k in head.state_dict())
    if not trunk_names or trunk_names & per_member or not per_member <= head_names:
        return None  # a trunk without weights (nothing to share), or entries on the wrong side
    return Split(trunk.eval(), head.eval(), prefix, trunk_names, head_names)


def _structure(model: nn.Module) -> nn.Module:
    """A copy of `model` sharing its tensors: the structure only."""
    own = itertools.chain(model.parameters(), model.buffers())
    return copy.deepcopy(model, memo={id(t): t for t in own})


def _replaced(skeleton: nn.Module, name: str, per_member: set[str]) -> Split | None:
    """Module `name` as the head, the model with it replaced by `nn.Identity` as the trunk."""
    modules = dict(skeleton.named_modules())
    if not name or name not in modules:
        return None
    trunk = _structure(skeleton)
    trunk.set_submodule(name, nn.Identity())
    return _split(trunk, modules[name], f"{name}.", per_member)


def candidates(skeleton: nn.Module, per_member: set[str]) -> list[Callable[[], Split | None]]:
    """The splits to check, in order (see the module doc), each built only when called (a
    build copies the model's structure: find_split builds the one it needs)."""
    found: list[Callable[[], Split | None]] = []
    declared = getattr(skeleton, "peg_head", None)
    if isinstance(declared, str):
        found.append(functools.partial(_replaced, skeleton, declared, per_member))
    if isinstance(skeleton, nn.Sequential):
        children = list(skeleton._modules)
        holds = [any(n.startswith(f"{c}.") for n in per_member) for c in children]
        k = holds.index(True) if True in holds else 0
        if k > 0:
            found.append(functools.partial(_sliced, skeleton, k, per_member))
    paths = [n.split(".")[:-1] for n in per_member]
    common = []
    for parts in zip(*paths, strict=False):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    for depth in range(len(common), 0, -1):  # the deepest module holding every entry first
        name = ".".join(common[:depth])
        found.append(functools.partial(_replaced, skeleton, name, per_member))
    return found


def _sliced(skeleton: nn.Sequential, k: int, per_member: set[str]) -> Split | None:
    """Children [0, k) as the trunk, the rest as the head."""
    try:
        return _split(skeleton[:k], skeleton[k:], "", per_member)
    except Exception:  # a Sequential subclass that cannot be sliced
        return None


def architecture(module: nn.Module) -> tuple[str, str, str]:
    """What a verdict about running `module` is cached under, in this process: its class (the
    defining module and name: two classes of one name may differ in `forward`) and its structure
    (`str(module)`: two `nn.Sequential`s are not one architecture)."""
    return type(module).__module__, type(module).__qualname__, str(module)


def _key(skeleton: nn.Module, per_member: set[str]) -> tuple[Any, ...]:
    declared = getattr(skeleton, "peg_head", None)
    return *architecture(skeleton), declared, frozenset(per_member)


def checked(skeleton: nn.Module, per_member: set[str]) -> bool:
    """Whether `find_split` has reached a verdict for this architecture and entries."""
    return _key(skeleton, per_member) in _SPLITS


def find_split(
    skeleton: nn.Module, per_member: set[str], states: Sequence[Mapping[str, Tensor]], x: Any
) -> Split | None:
    """The first candidate split whose logits match the model's own on two rows of `x` for
    every state in `states` (checked once per architecture and per-member entries; see the
    module doc), or None."""
    if not isinstance(x, (Tensor, Mapping)) or batch_rows(x) == 0:
        return None
    key = _key(skeleton, per_member)
    if key in _SPLITS:
        index = _SPLITS[key]
        return None if index is None else candidates(skeleton, per_member)[index]()
    found = candidates(skeleton, per_member)
    if not found:
        _SPLITS[key] = None
        return None
    rows = take_rows(x, 0, 2)
    training = training_modules(skeleton)
    for m in training:
        m.training = False
    try:
        with torch.no_grad():
            try:
                reference = [model_output(call_functional(skeleton, s, rows), "X") for s in states]
            except Exception:  # bad inputs: no verdict (the caller's own path reports them)
                return None
            _SPLITS[key] = None
            for index, build in enumerate(found):
                split = build()
                if split is not None and _agrees(split, states, rows, reference):
                    _SPLITS[key] = index
                    return split
            return None
    finally:
        for m in training:
            m.training = True


def _agrees(
    split: Split, states: Sequence[Mapping[str, Tensor]], rows: Any, reference: list[Tensor]
) -> bool:
    try:
        got = [split.logits(s, rows) for s in states]
    except Exception:  # e.g. a head called with two arguments
        return False
    return all(
        g.shape == r.shape and torch.allclose(g, r, rtol=1e-4, atol=1e-5)
        for g, r in zip(got, reference, strict=True)
    )
