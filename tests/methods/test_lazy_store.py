"""What a lazy PEG/PEP keeps (`lazy_store`): full rows give the eager members bit for bit,
16-bit rows differ from them by the stated rounding; `lazy="auto"` against a memory budget;
recipes saved from any store are the eager one's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import peg
from bad_inputs import raises_test
from peg.archive import read_header
from peg.methods.perturbation._lazy import StoredRows, available_memory

ERROR_CASES: list[tuple[str, str, Callable[[], object], type[Exception], str]] = [
    (
        "PEG",
        "lazy neither a bool nor 'auto'",
        lambda: peg.PEG(lazy="sometimes"),
        ValueError,
        "lazy",
    ),
    ("PEP", "lazy neither a bool nor 'auto'", lambda: peg.PEP(lazy=1), ValueError, "lazy"),
    (
        "PEG",
        "unknown lazy_store",
        lambda: peg.PEG(lazy=True, lazy_store="int8"),
        ValueError,
        "lazy_store",
    ),
    ("PEG", "memory_budget 0", lambda: peg.PEG(memory_budget=0), ValueError, "memory_budget"),
    ("PEP", "memory_budget < 0", lambda: peg.PEP(memory_budget=-1e9), ValueError, "memory_budget"),
    (
        "PEG",
        "memory_budget not finite",
        lambda: peg.PEG(memory_budget=float("nan")),
        ValueError,
        "memory_budget",
    ),
    (
        "PEG",
        "memory_budget not a number",
        lambda: peg.PEG(lazy="auto", memory_budget="2GB"),
        ValueError,
        "memory_budget",
    ),
]


def _fit(model, val, **options):
    return peg.PEG(n_members=6, grad_batch_size=32, progress=False, **options).fit(model, val)


@pytest.mark.parametrize("eta", [0.1, [0.01, 0.1]], ids=["fixed", "searched"])
def test_full_rows_give_the_eager_members_bit_for_bit(overfit_mlp, moons_data, eta):
    eager = _fit(overfit_mlp, moons_data["val"], eta=eta)
    lazy = _fit(overfit_mlp, moons_data["val"], eta=eta, lazy=True)  # lazy_store="full"
    X = moons_data["test"][0]
    assert lazy.lazy_store_ == "full"
    # one chunk of all 6 members: the eager ensemble's weights (the same arithmetic, `_stack`)
    # run on the same shapes, so the same kernels and bits
    assert torch.equal(lazy.member_logits(X, chunk_size=6), eager.member_logits(X))
    pairs = zip(lazy.ensemble().stacked.values(), eager.ensemble_.stacked.values(), strict=True)
    for got, want in pairs:
        assert torch.equal(got, want)


@pytest.mark.parametrize(("store", "bits"), [("bfloat16", 8), ("float16", 11)])
def test_16_bit_rows_round_the_displacement_only(overfit_mlp, moons_data, store, bits):
    val, X = moons_data["val"], moons_data["test"][0]
    eager = _fit(overfit_mlp, val, eta=0.1)
    lazy = _fit(overfit_mlp, val, eta=0.1, lazy=True, lazy_store=store)
    want, got = eager.member_logits(X), lazy.member_logits(X)
    assert not torch.equal(got, want)
    # each entry of a member's displacement from the base within 2^-bits of its value: the
    # logits move by a like fraction of how far the members' logits are from the base's
    spread = (want - overfit_mlp(X).detach()).abs().max()
    assert (got - want).abs().max() <= 4 * 2.0**-bits * spread
    for a, b in zip(
        lazy.ensemble().stacked.values(), eager.ensemble_.stacked.values(), strict=True
    ):
        assert not torch.equal(a, b)


def test_float16_rows_keep_tiny_and_large_entries():
    shapes = [torch.Size([3, 4]), torch.Size([5])]
    D = torch.cat([torch.randn(4, 12) * 1e-9, torch.randn(4, 5) * 1e4], 1)  # no float16 range
    D[2, :12] = 0.0  # a zero tensor in a row
    rows = StoredRows(5, shapes, "float16")
    rows.put([0, 1, 2, 4], D)
    back = rows.rows([4, 0, 2])
    assert back.dtype == torch.float32 and back.shape == (3, 17)
    torch.testing.assert_close(back, D[[3, 0, 2]], rtol=2.0**-11, atol=0.0)
    assert torch.equal(back[2, :12], torch.zeros(12))
    full = StoredRows(5, shapes, "full")
    full.put([0, 1, 2, 4], D.double())
    assert full.rows([4]).dtype == torch.float64 and torch.equal(full.rows([4])[0], D[3].double())


def test_lazy_auto_follows_the_memory_budget(overfit_mlp, moons_data):
    val, X = moons_data["val"], moons_data["test"][0]
    P = sum(p.numel() for p in overfit_mlp.parameters())
    rows = 6 * P * 4  # S·P float32 entries; the eager ensemble holds twice that
    want = _fit(overfit_mlp, val, eta=0.1).member_logits(X)
    for budget, store, held in [
        (None, "full", None),  # a tiny model: eager within any machine's default budget
        (2 * rows, "full", None),
        (2 * rows - 1, "full", "full"),
        (rows - 1, "full", "regenerate"),
        (rows - 1, "bfloat16", "bfloat16"),
        (rows // 2 - 1, "bfloat16", "regenerate"),
    ]:
        fitted = _fit(
            overfit_mlp, val, eta=0.1, lazy="auto", lazy_store=store, memory_budget=budget
        )
        assert fitted.lazy_store_ == held, (budget, store)
        assert hasattr(fitted, "ensemble_") == (held is None)
        if held in (None, "full", "regenerate"):  # one chunk of all 6: the same shapes
            assert torch.equal(fitted.member_logits(X, chunk_size=6), want)
    assert available_memory(torch.device("cpu")) > 0


@pytest.mark.parametrize("store", ["full", "bfloat16", "regenerate"])
def test_a_lazy_recipe_is_the_eager_one(overfit_mlp, moons_data, tmp_path, store):
    val, X = moons_data["val"], moons_data["test"][0]
    eager = _fit(overfit_mlp, val, eta=[0.01, 0.1])
    lazy = _fit(overfit_mlp, val, eta=[0.01, 0.1], lazy=True, lazy_store=store)
    paths = [obj.save(str(tmp_path / name)) for obj, name in ((eager, "e"), (lazy, "l"))]
    got, ref = (read_header(Path(p))["meta"]["recipe"] for p in paths)
    assert got == ref  # fingerprints of the full-precision rows, whatever is kept
    # rebuilt from the recipe: the eager members, bit for bit
    loaded = peg.load(paths[1], overfit_mlp, val=val)
    assert torch.equal(loaded.member_logits(X), eager.member_logits(X))
    if store == "full":  # one chunk of all 6 members: the same shapes, the same bits
        assert torch.equal(lazy.member_logits(X, chunk_size=6), loaded.member_logits(X))


def test_lazy_pep_stores_its_noise(overfit_mlp, moons_data):
    val, X = moons_data["val"], moons_data["test"][0]
    options = {"n_members": 4, "sigma": 0.02, "progress": False}
    eager = peg.PEP(**options).fit(overfit_mlp, val)
    for store in ("full", "float16"):
        lazy = peg.PEP(lazy=True, lazy_store=store, **options).fit(overfit_mlp, val)
        got, want = lazy.member_logits(X, chunk_size=4), eager.member_logits(X)
        if store == "full":  # one chunk of all 4 members: the same shapes, the same bits
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=0, atol=1e-3 * want.abs().max().item())


test_bad_lazy_options_raise_a_clear_error = raises_test(ERROR_CASES)
