"""The radial loss-landscape cut (Fort et al. 2019, Fig. 5): the plane through the origin of
weight space and two optima θ₁, θ₂.

The plane gets an orthonormal basis by Gram–Schmidt, e₁ = θ₁/‖θ₁‖ and e₂ ∝ θ₂ − (θ₂·e₁)e₁, so
distances and angles in the figure are those of weight space; θ₁ sits at (‖θ₁‖, 0) and θ₂ at
(θ₂·e₁, θ₂·e₂). The grid axes always contain those coordinates exactly, so the grid evaluates
the optima themselves (up to float rounding of the basis) next to everything around them.

Only the trainable floating-point parameters live in the plane; buffers (BatchNorm statistics)
are taken from θ₁ at every grid point. At each point the model is scored on (X, y): accuracy,
NLL and the agreement (fraction of points with the same predicted class) with each optimum.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call

from peg._params import flatten_state, unflatten_state
from peg.ensemble import model_output
from peg.source._devices import move
from peg.utils.progress import bar
from peg.utils.scalars import check_positive_int

EVAL_BATCH_SIZE = 1024


def plane_names(skeleton: nn.Module) -> list[str]:
    """The state-dict entries spanned by the plane: trainable floating-point parameters."""
    names = [n for n, p in skeleton.named_parameters() if p.requires_grad and p.is_floating_point()]
    if not names:
        raise ValueError("skeleton: has no trainable floating-point parameters")
    return names


def plane_basis(theta1: Tensor, theta2: Tensor) -> tuple[Tensor, Tensor]:
    """Orthonormal basis `[2, P]` of the plane through 0, θ₁ and θ₂, and their coordinates `[2, 2]`.

    Args:
        theta1, theta2: flat weight vectors `[P]` of the two optima.

    Returns:
        `(basis [2, P], coords [2, 2])` in float64; row i of `coords` is optimum i's (x, y).
    """
    a = torch.as_tensor(theta1).detach().double().reshape(-1)
    b = torch.as_tensor(theta2).detach().double().reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"theta2: expected {a.numel()} weights like theta1, got {b.numel()}")
    n1 = a.norm()
    if n1 == 0:
        raise ValueError("theta1: all-zero weights do not span a direction")
    e1 = a / n1
    rest = b - (b @ e1) * e1
    n2 = rest.norm()
    if n2 <= 1e-12 * b.norm().clamp_min(1e-300):
        raise ValueError("theta2: parallel to theta1, so the two optima do not span a plane")
    e2 = rest / n2
    basis = torch.stack([e1, e2])
    coords = torch.tensor([[float(n1), 0.0], [float(b @ e1), float(n2)]], dtype=torch.float64)
    return basis, coords


def project(vectors: Tensor, basis: Tensor) -> Tensor:
    """Coordinates `[K, 2]` of flat weight vectors `[K, P]` projected onto the plane."""
    V = torch.as_tensor(vectors).detach().double()
    if V.ndim != 2 or V.shape[1] != basis.shape[1]:
        raise ValueError(
            f"vectors: expected [K, {basis.shape[1]}] flat weights, got {tuple(V.shape)}"
        )
    return V @ basis.T


def _axis(values: Sequence[float], resolution: int, margin: float) -> np.ndarray:
    """`resolution` evenly spaced values spanning `values` (plus a margin), with every one of
    `values` inserted exactly."""
    lo, hi = min(values), max(values)
    pad = margin * (hi - lo if hi > lo else max(abs(hi), 1.0))
    grid = np.linspace(lo - pad, hi + pad, resolution)
    return np.unique(np.concatenate([grid, np.asarray(values, dtype=np.float64)]))


@torch.no_grad()
def _scores(
    model: nn.Module, state: Mapping[str, Tensor], X: Tensor, y: Tensor
) -> tuple[Tensor, float]:
    """(predicted classes [N], NLL) of `model` carrying `state` on (X, y)."""
    device = next(iter(state.values())).device
    preds, nll_sum = [], 0.0
    for start in range(0, len(X), EVAL_BATCH_SIZE):
        xb = move(X[start : start + EVAL_BATCH_SIZE], device)
        out = model_output(functional_call(model, dict(state), (xb,)), "radial_cut").double()
        yb = move(y[start : start + EVAL_BATCH_SIZE], device, "y")
        nll_sum += float(torch.nn.functional.cross_entropy(out, yb, reduction="sum"))
        preds.append(out.argmax(-1).cpu())
    return torch.cat(preds), nll_sum / len(X)


def radial_cut(
    skeleton: nn.Module,
    optima: Sequence[Mapping[str, Tensor]],
    X: Tensor,
    y: Tensor,
    resolution: int = 21,
    margin: float = 0.2,
    paths: Mapping[str, Sequence[Mapping[str, Tensor]]] | None = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Accuracy, NLL and agreement with each optimum on a grid over the plane (0, θ₁, θ₂).

    Args:
        skeleton: the architecture (its own weights are not used; it is copied, eval mode).
        optima: the two optima's state dicts [θ₁, θ₂], same architecture as `skeleton`.
        X: inputs `[N, ...]`; y: labels `[N]`.
        resolution: grid points per axis before the exact coordinates of the origin and the
            optima are inserted (so each axis has resolution to resolution + 3 values), >= 2.
        margin: extra room on each side, as a fraction of the span of the origin and optima.
        paths: optional named lists of state dicts (e.g. trajectories, subspace samples) to
            project onto the plane for the figure.
        progress: progress bar over grid points.

    Returns:
        A JSON-ready dict: "x" `[nx]`, "y" `[ny]` (axis values, weight units), "accuracy",
        "nll", "agreement_1", "agreement_2" (each `[ny, nx]`, row = y), "optima" `[2, 2]`
        coordinates, "optima_accuracy" `[2]` and "optima_index" `[2, 2]` (the (row, col) of
        each optimum on the grid), "paths" {name: [K, 2] projected coordinates}.
    """
    if not isinstance(skeleton, nn.Module):
        raise TypeError(f"skeleton: expected an nn.Module, got {type(skeleton).__name__}")
    if not isinstance(optima, Sequence) or len(optima) != 2:
        got = len(optima) if isinstance(optima, Sequence) else type(optima).__name__
        raise ValueError(f"optima: expected exactly 2 state dicts [θ₁, θ₂], got {got}")
    resolution = check_positive_int(resolution, "resolution", minimum=2)
    if not (isinstance(margin, (int, float)) and margin >= 0):
        raise ValueError(f"margin: expected a number >= 0, got {margin!r}")
    X = torch.as_tensor(X)
    y = torch.as_tensor(y).long()
    if X.shape[0] == 0 or y.shape != (X.shape[0],):
        raise ValueError(
            f"y: expected labels [{X.shape[0]}] for X of shape {tuple(X.shape)}, "
            f"got {tuple(y.shape)}"
        )
    model = copy.deepcopy(skeleton).eval()
    names = plane_names(model)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    for i, state in enumerate(optima):
        if {k: v.shape for k, v in state.items()} != expected:
            raise ValueError(f"optima: state dict {i} does not match the skeleton's names/shapes")
    base = {k: v.detach() for k, v in optima[0].items()}
    thetas = [flatten_state(s, names) for s in optima]
    basis, coords = plane_basis(thetas[0], thetas[1])
    xs = _axis([0.0, float(coords[0, 0]), float(coords[1, 0])], resolution, margin)
    ys = _axis([0.0, float(coords[0, 1]), float(coords[1, 1])], resolution, margin)

    ref_preds = [_scores(model, s, X, y)[0] for s in optima]
    shape = (len(ys), len(xs))
    acc, nll = np.zeros(shape), np.zeros(shape)
    agree = np.zeros((2, *shape))
    cells = [(i, j) for i in range(len(ys)) for j in range(len(xs))]
    for i, j in bar(cells, f"radial cut ({len(cells)} points)", len(cells), progress):
        vector = xs[j] * basis[0] + ys[i] * basis[1]
        state = unflatten_state(vector, base, names)
        preds, nll[i, j] = _scores(model, state, X, y)
        acc[i, j] = float((preds == y).double().mean())
        for k in range(2):
            agree[k, i, j] = float((preds == ref_preds[k]).double().mean())

    # the axes hold the optima's coordinates exactly (see _axis): find their cells
    index = [
        [
            int(np.flatnonzero(ys == float(coords[k, 1]))[0]),
            int(np.flatnonzero(xs == float(coords[k, 0]))[0]),
        ]
        for k in range(2)
    ]
    projected = {}
    for name, states in (paths or {}).items():
        if not states:
            continue
        V = torch.stack([flatten_state(s, names) for s in states])
        projected[str(name)] = project(V, basis).tolist()
    return {
        "x": xs.tolist(),
        "y": ys.tolist(),
        "accuracy": acc.tolist(),
        "nll": nll.tolist(),
        "agreement_1": agree[0].tolist(),
        "agreement_2": agree[1].tolist(),
        "optima": coords.tolist(),
        "optima_accuracy": [float((p == y).double().mean()) for p in ref_preds],
        "optima_index": index,
        "paths": projected,
    }
