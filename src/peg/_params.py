"""Parameters: which ones a method changes, and flat vectors ↔ state dicts.

- `select_parameters(model, params) -> names`: the trainable parameters `params` ("all",
  "weights" or a callable) selects.
- `module_like(skeleton, state)`: a copy of a module running stored tensors without copying
  them; `refresh_bn(skeleton, state, batches)`: BatchNorm statistics re-estimated for a state.

Flat vectors: the one place weights are flattened and put back.

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

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector
from torch.optim.swa_utils import update_bn

ParamFilter = Literal["all", "weights"] | Callable[[str, nn.Parameter], bool]


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


def select_parameters(model: nn.Module, params: ParamFilter) -> list[str]:
    """Names of the trainable parameters to perturb."""
    if params == "all":
        keep = lambda name, p: True  # noqa: E731
    elif params == "weights":  # conv / linear weight tensors, as the original PEP code
        keep = lambda name, p: p.ndim >= 2  # noqa: E731
    elif callable(params):
        keep = params
    else:
        raise ValueError(f"params: expected 'all', 'weights' or a callable, got {params!r}")
    names = [n for n, p in model.named_parameters() if p.requires_grad and keep(n, p)]
    if not names:
        raise ValueError(
            "model: has no trainable parameters to perturb (requires_grad=True"
            + (f" and selected by params={params!r})" if params != "all" else ")")
        )
    return names


def module_like(skeleton: nn.Module, state: Mapping[str, Tensor]) -> nn.Module:
    """A copy of `skeleton` whose state-dict entries ARE the tensors of `state` (no copy).

    Used to run a stored base model without duplicating its weights, and with tensors on the
    meta device for a skeleton that costs no memory. Buffers outside the state dict
    (non-persistent ones) are copied.
    """
    memo: dict[int, Any] = {}
    for name, t in skeleton.state_dict(keep_vars=True).items():
        memo[id(t)] = (
            nn.Parameter(state[name], requires_grad=t.requires_grad)
            if isinstance(t, nn.Parameter)
            else state[name]
        )
    return copy.deepcopy(skeleton, memo)


def refresh_bn(
    skeleton: nn.Module, state: dict[str, Tensor], batches: list[Tensor]
) -> dict[str, Tensor]:
    """`state` with BatchNorm running statistics re-estimated on `batches` (swa_utils.update_bn)."""
    model = copy.deepcopy(skeleton)
    model.load_state_dict(state)
    update_bn(batches, model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
