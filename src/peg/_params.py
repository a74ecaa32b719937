"""Parameters: which ones a method changes, and flat vectors ↔ state dicts.

- `select_parameters(model, params) -> names`: the trainable parameters `params` selects
  ("all", "weights", "last_layer", a list of module names or a callable; `check_param_filter`
  checks the choice without a model).
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
- `laid_out_like(stacked, like)`: members' entries `[M, ...]` (stacked from flat rows:
  contiguous) laid out as the model's own entry where that is channels-last.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector

from peg._bn import update_bn
from peg._forward import eval_mode
from peg.source._devices import move, weights_device
from peg.source.batches import call_model

ParamFilter = (
    Literal["all", "weights", "last_layer"] | Sequence[str] | Callable[[str, nn.Parameter], bool]
)
PARAM_CHOICES = (
    "'all', 'weights', 'last_layer', a non-empty list of module names or a callable "
    "(name, parameter) -> bool"
)
_LAYERS = (nn.Linear, nn.modules.conv._ConvNd)


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


def check_param_filter(params: Any) -> None:
    """Raise a ValueError naming `params` unless it is one of the choices (`ParamFilter`)."""
    named = isinstance(params, str) and params in ("all", "weights", "last_layer")
    modules = isinstance(params, (list, tuple)) and all(isinstance(n, str) for n in params)
    if named or callable(params) or (modules and len(params) > 0):
        return
    raise ValueError(f"params: expected {PARAM_CHOICES}, got {params!r}")


def param_label(params: ParamFilter) -> str | list[str]:
    """`params` as JSON for an ensemble's meta: a name, a list of module names, or the
    callable's name."""
    if isinstance(params, str):
        return params
    if isinstance(params, (list, tuple)):
        return list(params)
    return getattr(params, "__name__", "callable")


def last_layer(model: nn.Module, x: Any = None) -> str:
    """The name of the layer producing the outputs: the last Linear or Conv module with
    trainable parameters to run in a forward pass on `x` (two rows suffice: the structure of
    the computation, whatever the modules are called: `classifier`, `score`, `fc`, `head`...),
    or, without `x` or when no such module runs (weights used functionally), the last one in
    `named_modules()` order. A ValueError naming the modules seen and the `params=` override
    when there is none."""
    found = [
        name
        for name, m in model.named_modules()
        if isinstance(m, _LAYERS) and any(p.requires_grad for p in m.parameters(recurse=False))
    ]
    if not found:
        seen = [f"{n} ({type(m).__name__})" for n, m in model.named_modules() if n][:8]
        raise ValueError(
            "params: 'last_layer' found no Linear or Conv module with trainable parameters in "
            f"the model ({type(model).__name__}; modules seen: {seen}); name the head's "
            "modules instead, params=['name', ...]"
        )
    if x is not None:
        ran = _run_order(model, [n for n in found], x)
        if ran:
            return ran[-1]
    return found[-1]


def _run_order(model: nn.Module, names: list[str], x: Any) -> list[str]:
    """Modules `names` of `model` in the order a forward pass on `x` runs them (no gradient,
    eval mode, every mode restored); [] if the pass fails (the caller's checks report it)."""
    modules = dict(model.named_modules())
    order: list[str] = []
    hooks = [modules[n].register_forward_hook(lambda m, i, o, n=n: order.append(n)) for n in names]
    try:
        with torch.no_grad(), eval_mode(model):
            call_model(model, move(x, weights_device(model)))  # data follows the model
    except Exception:
        return []
    finally:
        for h in hooks:
            h.remove()
    return order


def select_parameters(model: nn.Module, params: ParamFilter, x: Any = None) -> list[str]:
    """Names of the trainable parameters to perturb, in `named_parameters()` order.

    `params`: "all"; "weights" (tensors with ndim ≥ 2: conv/linear weights); "last_layer" (the
    parameters of `last_layer(model)`); a list of module names (every trainable parameter in
    those modules and their submodules); or a callable (name, parameter) -> bool. `x`: a
    few rows of inputs for "last_layer" to find the layer by running the model (`last_layer`).
    """
    check_param_filter(params)
    if isinstance(params, str) and params == "last_layer":
        params = [last_layer(model, x)]
    if params == "all":
        keep = lambda name, p: True  # noqa: E731
    elif params == "weights":  # conv / linear weight tensors, as the original PEP code
        keep = lambda name, p: p.ndim >= 2  # noqa: E731
    elif isinstance(params, (list, tuple)):
        modules = dict(model.named_modules())
        unknown = [n for n in params if n not in modules]
        if unknown:
            some = [n for n in modules if n][:8]
            raise ValueError(
                f"params: no module named {unknown[0]!r} in the model (modules: {some}"
                + (", ...)" if len(modules) > 9 else ")")
            )
        prefixes = tuple(f"{n}." if n else "" for n in params)  # "": the model
        keep = lambda name, p: name.startswith(prefixes)  # noqa: E731
    else:
        keep = params
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
    skeleton: nn.Module, state: dict[str, Tensor], batches: Iterable[Any]
) -> dict[str, Tensor]:
    """`state` with BatchNorm running statistics re-estimated on `batches` (input batches of
    any shape, a list or a re-iterable stream such as `peg.source.Source.replay`; `update_bn`)."""
    model = copy.deepcopy(skeleton)
    model.load_state_dict(state)
    update_bn(batches, model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def laid_out_like(stacked: Tensor, like: Tensor | None) -> Tensor:
    """`stacked` `[M, ...]` with every member laid out as `like`, the skeleton's entry, where that
    is channels-last: a channels-last model's members then run the channels-last kernels too (a
    CPU max-pool of a CNN's features: 10 × faster than on contiguous ones); `stacked` itself
    otherwise (a contiguous model: nothing moves, the same bits as ever). Strides are compared,
    not `is_contiguous()`: a one-channel convolution's weight is both, and its strides alone
    tell the kernels which layout to run."""
    if like is None or like.shape != stacked.shape[1:] or like.stride() == stacked.stride()[1:]:
        return stacked
    layout = {4: torch.channels_last, 5: torch.channels_last_3d}.get(like.ndim)
    if layout is None or not like.is_contiguous(memory_format=layout):
        return stacked
    strides = (like.numel(), *like.stride())
    out = torch.empty_strided(stacked.shape, strides, dtype=stacked.dtype, device=stacked.device)
    return out.copy_(stacked)


def runs_channels_last(model: nn.Module, x: Any) -> bool:
    """Whether passes of `model` on inputs like `x` should run channels-last although the model
    is held contiguous: images `[B, C, H, W]` on the CPU through a contiguous 2-d convolution.
    The CPU's channels-last kernels are the faster ones there (a SmallCNN's forward on 512
    Fashion-MNIST images: 0.031 s against 0.055 s, its max-pool 4 × faster; a gradient 1.5 ×);
    a GPU model, a channels-last one, or one without a convolution is run as it is held."""
    if not (isinstance(x, Tensor) and x.ndim == 4 and x.is_floating_point()):
        return False
    return x.device.type == "cpu" and has_contiguous_cpu_convs(model)


def has_contiguous_cpu_convs(model: nn.Module) -> bool:
    """Whether `model` has 2-d convolutions, all contiguous on the CPU: the model's half of
    `runs_channels_last`, asked first so that a model without them reads no probe inputs."""
    convs = [m.weight for m in model.modules() if isinstance(m, nn.Conv2d)]
    return bool(convs) and all(w.device.type == "cpu" and w.is_contiguous() for w in convs)


@torch.no_grad()
def to_channels_last(module: nn.Module, x: Tensor) -> bool:
    """Lay out `module` (a private copy, in eval mode) channels-last, in place, if a forward on
    two rows of `x` runs so; True then. A model that `.view`s its activations fails on
    channels-last ones (their strides do not allow the view): it is put back as it was."""
    module.to(memory_format=torch.channels_last)
    try:
        call_model(module, x[:2].contiguous(memory_format=torch.channels_last))
    except RuntimeError:
        module.to(memory_format=torch.contiguous_format)
        return False
    return True
