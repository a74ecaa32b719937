"""PEG and PEP ensembles stored as recipes: base weights + how the members were made.

A member of PEG is θ_r − η·∇L(θ_r; B_i) and of PEP θ_r + σ·ε_i, with B_i and ε_i drawn from
seeded streams, so (base weights, seed, scale, hyper-parameters, validation data) determine the
ensemble. `PEG.save(path)` / `PEP.save(path)` write the base models and that recipe by default
(about the size of the bases, whatever the number of members; `materialize=True` writes the
members instead); `peg.load(path, model, val=val)` rebuilds the members from the validation data
and checks them against the fingerprints taken when the ensemble was made, failing clearly if
the data or the code changed (`PerturbationEnsemble.from_recipe`, found through the registry
below).

A recipe (JSON, in the archive header's `meta["recipe"]`) records: the method, the constructor
options (S, seed, BatchNorm mode, and for PEG K, the variant, ...), the chosen scale (η or σ),
whether it was searched (which fixes how the validation data was split), the validation data's
fingerprint and size, the number of members and their fingerprints.

Fingerprints: the data's is the SHA-256 of the validation inputs and labels, taken as they are
read (`peg.source._fingerprint`); a member's is the inner product of its perturbed parameters
with a fixed random vector, and their norm, compared with a relative tolerance of 1e-4
(gradients may differ in the last bits across thread counts).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from peg._schema import Fields, in_range
from peg.errors import ArchiveError
from peg.utils.registry import Registry

# 2: option names of the method contract (n_members, batch_size, ...); 3: the search's options
# in one `search` object (`peg.ScaleSearch`); 4: K-FAC's input factors from their rows where
# they are fewer than the inputs (`_precondition.InputMoment`; older recipes rebuild summed)
RECIPE_VERSION = 4
FINGERPRINT_SEED = 20_241_121
TOLERANCE = 1e-4  # float32 gradients rebuilt with rounding in another order
ARITHMETIC = ("fp32", "tf32")  # what `arithmetic` records
TF32_TOLERANCE = 1e-2  # TF32 products (10-bit mantissa) on either side: see docs/determinism.md


def fingerprint_probe(P: int) -> Tensor:
    """The fixed random vector `[P]` (float32) that `displacement_fingerprints` projects on."""
    return torch.randn(P, generator=torch.Generator().manual_seed(FINGERPRINT_SEED))


def fingerprint_rows(
    D: Tensor, scale: float, probe: Tensor, step: int = 2**20
) -> list[list[float]]:
    """`[projection, norm]` of scale·D[i] for each row of D `[k, P]`, in float64 pieces of
    `step` entries instead of a float64 copy of every row; `probe` is `fingerprint_probe(P)`."""
    out = []
    for row in D:
        proj = sq = 0.0
        for a in range(0, len(row), step):
            v = scale * row[a : a + step].detach().double().cpu()
            proj += float(v @ probe[a : a + step].double())
            sq += float(v @ v)
        out.append([proj, math.sqrt(sq)])
    return out


def displacement_fingerprints(directions: list[Tensor], scale: float) -> list[list[float]]:
    """Per member `[projection, norm]` of its displacement scale·D_i from its base (float64).

    The displacement, not the member, is fingerprinted: with a small scale the members differ
    from their bases in the last digits only, which a fingerprint of the weights would miss.
    """
    probe = fingerprint_probe(directions[0].shape[1])
    return [fp for D in directions for fp in fingerprint_rows(D, scale, probe)]


def arithmetic(device: torch.device) -> str:
    """How a recipe's gradients were computed, as far as rounding goes: "tf32" on a CUDA device
    where TF32 is allowed (PyTorch's default for cuDNN convolutions: 10 bits of mantissa in the
    products), "fp32" elsewhere."""
    tf32 = torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32
    return "tf32" if device.type == "cuda" and tf32 else "fp32"


def tolerance(*kinds: str) -> float:
    """The fingerprint tolerance between members computed in the `arithmetic` kinds given:
    `TOLERANCE` in float32, `TF32_TOLERANCE` where either side rounded products to TF32."""
    return TF32_TOLERANCE if "tf32" in kinds else TOLERANCE


def fingerprints_match(
    a: list[list[float]], b: list[list[float]], P: int, tol: float = TOLERANCE
) -> list[int]:
    """Indices of the members whose fingerprints (`displacement_fingerprints` over `P`
    parameters) differ by more than `tol`.

    A displacement's norm must agree to `tol` relatively. Its projection on the probe (standard
    normal entries) is compared on the scale of a typical projection of a vector of that norm,
    the norm itself (E[(v·probe)²] = ‖v‖²), not relatively to itself: a projection is a sum of
    P terms of both signs, and where they nearly cancel (a member almost orthogonal to the
    probe) rounding in another order (a GPU's non-deterministic kernels, another thread count)
    moves it by far more than its own size times `tol`. A change of the displacement by a
    relative ε moves the projection by ~ε·norm: rounding passes, a member built from another
    mini-batch (ε ~ 1) does not.
    """
    if len(a) != len(b):
        return list(range(max(len(a), len(b))))
    return [
        i
        for i, ((pa, na), (pb, nb)) in enumerate(zip(a, b, strict=True))
        if not math.isclose(na, nb, rel_tol=tol, abs_tol=1e-12)
        or abs(pa - pb) > tol * max(na, nb) + 1e-12
    ]


__all__ = [
    "REBUILDERS",
    "arithmetic",
    "check",
    "displacement_fingerprints",
    "fingerprint_probe",
    "fingerprint_rows",
    "fingerprints_match",
    "of_meta",
    "rebuilder",
    "register",
    "tolerance",
]


# ------------------------------------------------------------------------- the registry
# method name → (`rebuild(bases, recipe, val, batch_fn)`: the fitted method, its members checked;
# `check(bases, recipe)`: the recipe's method-specific fields checked before any work, an
# ArchiveError naming the field). A class joins when it is defined
# (`PerturbationEnsemble.__init_subclass__`), so loading an archive needs no import of any method.
Rebuild = Callable[[Any, dict[str, Any], Any, Any], Any]
Check = Callable[[Any, dict[str, Any]], None]
REBUILDERS: Registry[tuple[Rebuild, Check]] = Registry("recipe method")


def register(method: str, rebuild: Rebuild, check: Check) -> None:
    """Make recipes of `method` loadable with `rebuild(bases: Ensemble, recipe, val, batch_fn)`,
    once `check(bases, recipe)` has passed (`REBUILDERS.add(method, (rebuild, check))`)."""
    REBUILDERS.add(method, (rebuild, check))


# the fields only a PEG/PEP recipe has (a `peg.train.Recipe`, which DeepEnsemble and SWAG record
# under the same key, has none of them)
RECIPE_FIELDS = ("fingerprints", "scale_name", "recipe_version")


def of_meta(meta: Any, where: str) -> dict[str, Any] | None:
    """The PEG/PEP recipe of archive `where` (its meta `meta`), or None: meta["recipe"] of
    other archives (a DeepEnsemble's or SWAG's) is the `peg.train.Recipe` they were trained with.

    A recipe is one by its fields, not by its `kind` alone: with `kind` edited, a PEG-3 recipe
    loaded as its one base model, silently; it is an ArchiveError naming the field."""
    made = meta.get("recipe") if isinstance(meta, dict) else None
    if not isinstance(made, dict):
        return None
    if made.get("kind") == "recipe":
        return made
    found = [k for k in RECIPE_FIELDS if k in made]
    if found:
        raise ArchiveError(
            f"{where}: header field 'meta.recipe.kind': expected 'recipe' for a PEG/PEP recipe "
            f"(it has {found}), got {made.get('kind')!r}"
        )
    return None


def check(made: Any, where: str) -> dict[str, Any]:
    """The recipe of archive `where` (the header's `meta.recipe`) checked against the format:
    types, ranges and counts that agree (as many fingerprints as members), before any work."""
    fields = Fields(made, where, "meta.recipe.")
    version = fields.integer("recipe_version", minimum=1, optional=True, default=1)
    method = fields.text("method")
    if version > RECIPE_VERSION or method not in REBUILDERS:
        raise ArchiveError(
            f"{where}: recipe of an unknown kind {method!r} (known: {sorted(REBUILDERS)}) or a "
            f"newer version ({version}; this peg reads {RECIPE_VERSION}); upgrade peg"
        )
    fields.object("options")
    fields.text("scale_name")
    fields.number("scale", positive=True)
    fields.boolean("searched")
    fields.get("data", lambda v: v is None or isinstance(v, str), "a hex digest or null")
    fields.integer("data_points", minimum=1, optional=True, nullable=True)
    members = fields.integer("members", minimum=1)
    fields.get(
        "fingerprints",
        lambda v: isinstance(v, list) and len(v) == members and all(_pair(p) for p in v),
        f"a list of {members} [projection, norm] pairs of finite numbers (one per member)",
    )
    fields.get("arithmetic", lambda v: v in ARITHMETIC, f"one of {list(ARITHMETIC)}", True)
    return made


def _pair(p: Any) -> bool:
    finite = (in_range(x, None, None, (int, float)) for x in p) if isinstance(p, list) else ()
    return isinstance(p, list) and len(p) == 2 and all(finite)


def rebuilder(made: dict[str, Any], bases: Any, where: str) -> Rebuild:
    """The rebuild function for a recipe checked by `check`, once its method's own `check` has
    passed on `bases` (an ArchiveError naming `where` and the field otherwise)."""
    rebuild, check_method = REBUILDERS[made["method"]]
    try:
        check_method(bases, made)
    except ArchiveError as e:
        raise ArchiveError(f"{where}: {e}") from None
    return rebuild
