"""`Ensemble.member_logits` on a tensor of one batch skips the batch generators (issue 38):
the same bits, the same checks, as the batch-by-batch path."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import peg


@pytest.fixture()
def ens() -> peg.Ensemble:
    torch.manual_seed(0)
    members = [nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Linear(8, 4)) for _ in range(5)]
    return peg.Ensemble.from_models([m.eval() for m in members])


@pytest.mark.parametrize("strategy", ["auto", "loop", "vmap", "folded", "chunked"])
def test_one_batch_as_the_batches_give_it(ens, strategy):
    X = torch.randn(16, 3)
    size = 2 if strategy == "chunked" else None
    got = ens.member_logits(X, 16, strategy=strategy, chunk_size=size)
    batches = torch.cat(list(ens.iter_member_logits(X, 16, strategy, chunk_size=size)), dim=1)
    assert got.shape == (5, 16, 4) and got.is_contiguous()
    # one batch of 16 either way: the same strategy on the same shapes, so the same kernels
    torch.testing.assert_close(got, batches, rtol=0, atol=0)
    several = ens.member_logits(X, 5, strategy=strategy, chunk_size=size)  # 4 batches
    torch.testing.assert_close(got, several)  # other shapes: float32 rounding may differ


def test_one_batch_checks_as_before(ens):
    with pytest.raises(ValueError, match="X: no inputs"):
        ens.member_logits(torch.empty(0, 3))
    with pytest.raises(ValueError, match="strategy: expected one of"):
        ens.member_logits(torch.randn(2, 3), strategy="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chunk_size"):
        ens.member_logits(torch.randn(2, 3), strategy="chunked")
    with pytest.raises(ValueError, match="batch_size"):
        ens.member_logits(torch.randn(2, 3), 0)


def test_one_batch_leaves_training_modules_as_they_were(ens):
    X = torch.randn(4, 3)
    ens.skeleton.train()
    logits = ens.member_logits(X)  # eval mode inside: running statistics
    assert ens.skeleton.training and all(m.training for m in ens.skeleton.modules())
    ens.skeleton.eval()
    # the same call on the same input again: the same kernels, so the same bits
    torch.testing.assert_close(logits, ens.member_logits(X), rtol=0, atol=0)


def test_a_repeated_call_reuses_the_loops_verdict_only_where_it_holds():
    """A loop settled on one call is reused by the next call with the same arguments, input
    shape, dtype and device on the same weights (`_ready_again`), with the same bits; any change
    of these (another shape, other arguments, a subset, another storage) decides anew. Against
    the plain modules (other storage, maybe another kernel), up to float32 rounding."""
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)) for _ in range(3)]
    ens = peg.Ensemble.from_models(models)
    x = torch.randn(16, 4)

    def plain(x: torch.Tensor, members=models) -> torch.Tensor:
        with torch.no_grad():
            return torch.stack([m(x) for m in members])

    first = [ens.member_logits(x, strategy="loop") for _ in range(3)]
    memo = ens.__dict__.get("_ready_memo")
    assert memo is not None and memo[2][2] == x.shape  # reused from the second call on
    assert all(torch.equal(out, first[0]) for out in first)  # the reused loop: the same bits
    torch.testing.assert_close(first[0], plain(x))
    other = torch.randn(7, 4)
    torch.testing.assert_close(ens.member_logits(other, strategy="loop"), plain(other))
    # two batches of 8: a matrix product of other sizes may round otherwise
    torch.testing.assert_close(ens.member_logits(x, batch_size=8, strategy="loop"), plain(x))
    subset = ens.subset([0, 2]).member_logits(x, strategy="loop")
    torch.testing.assert_close(subset, plain(x)[[0, 2]])
    assert ens._ready_again(("loop", None, torch.Size([5, 4]), x.dtype, x.device, ())) is None
    moved = ens.to(torch.float64)  # new storage: the memo's weights are not these
    assert moved._ready_again(memo[2]) is None
    with pytest.raises(ValueError, match="X: the model cannot run"):
        ens.member_logits(torch.randn(16, 5), strategy="loop")
