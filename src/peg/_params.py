"""Flat parameter vectors ↔ state dicts: the one place weights are flattened and put back.

The convention everywhere (PEG/PEP directions, SWAG moments, subspace samplers, the loss
landscape, weight diversity): the selected entries, in the given order (`named_parameters()`
order in practice), each flattened row-major (`reshape(-1)`) and concatenated into `[P]`.

- `parameter_vector(module) -> [P]`: a module's parameters (torch's `parameters_to_vector`).
- `flatten_state(state, names) -> [P]`: entries of a state dict.
- `unflatten_state(vector, base, names) -> state`: the inverse, a copy of `base`.
- `entry_views(flat, shapes)`: views of a flat `[..., P]` as the entries `[..., *shape]`
  (no copy), for writing into or reading out of a flat buffer or a batch of rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector


def parameter_vector(module: nn.Module) -> Tensor:
    """The parameters of `module` (in `parameters()` order) as one detached vector `[P]`."""
    return parameters_to_vector(module.parameters()).detach()


def flatten_state(
    state: Mapping[str, Tensor], names: Sequence[str], dtype: torch.dtype | None = None
) -> Tensor:
    """The entries `names` of `state`, each flattened row-major, concatenated: `[P]` (detached).

    With `dtype`, each entry is converted before the concatenation (so integer entries next to
    float ones are not first promoted to the float type).
    """
    parts = [state[n].detach().reshape(-1) for n in names]
    return torch.cat(parts if dtype is None else [p.to(dtype) for p in parts])


def unflatten_state(
    vector: Tensor, base: Mapping[str, Tensor], names: Sequence[str]
) -> dict[str, Tensor]:
    """A copy of `base` with the entries `names` read from `vector` `[P]` (inverse of
    `flatten_state`); shapes and dtypes are those of `base`."""
    sizes = [base[n].numel() for n in names]
    if vector.numel() != sum(sizes):
        raise ValueError(f"vector: expected {sum(sizes)} entries, got {vector.numel()}")
    state = dict(base)
    for n, part in zip(names, entry_views(vector, [base[n].shape for n in names]), strict=True):
        state[n] = part.to(base[n].dtype).clone()
    return state


def entry_views(flat: Tensor, shapes: Sequence[Sequence[int]]) -> list[Tensor]:
    """Views of the last dimension of `flat` `[..., P]` as consecutive entries `[..., *shape]`.

    No copy: writing into a view writes into `flat`. `flat`'s last dimension must be
    contiguous and hold exactly the entries (P = Σ prod(shape)).
    """
    sizes = [math.prod(s) for s in shapes]
    if flat.shape[-1] != sum(sizes):
        raise ValueError(f"flat: expected {sum(sizes)} entries per row, got {flat.shape[-1]}")
    lead = tuple(flat.shape[:-1])
    return [
        part.view(*lead, *shape) for part, shape in zip(flat.split(sizes, -1), shapes, strict=True)
    ]
