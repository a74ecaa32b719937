"""Which parameters a method perturbs, and the module plumbing around them.

`select_parameters` turns `params` ("all", "weights" or a callable) into state-dict names;
`base_models` accepts one model, a list of them or an `Ensemble`; `module_like` runs stored
weights in a model's structure without copying them; `refresh_bn` re-estimates BatchNorm
statistics of a perturbed state (`torch.optim.swa_utils.update_bn`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from torch import Tensor, nn
from torch.optim.swa_utils import update_bn

from peg.ensemble import Ensemble
from peg.methods.base import FittedEnsemble

ParamFilter = Literal["all", "weights"] | Callable[[str, nn.Parameter], bool]
Models = nn.Module | Sequence[nn.Module] | Ensemble


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


def refresh_bn(
    skeleton: nn.Module, state: dict[str, Tensor], batches: list[Tensor]
) -> dict[str, Tensor]:
    """`state` with BatchNorm running statistics re-estimated on `batches` (swa_utils.update_bn)."""
    model = copy.deepcopy(skeleton)
    model.load_state_dict(state)
    update_bn(batches, model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
