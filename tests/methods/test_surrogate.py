"""The default scale search: exact scorings guided by interpolated member outputs."""

from __future__ import annotations

import math

import pytest
import torch

import peg
from peg.losses import gaussian_nll_loss
from peg.methods.perturbation._criteria import POINT_LOSSES
from peg.methods.perturbation._surrogate import (
    SCORE,
    STOP,
    UNSURE,
    Interpolant,
    Settle,
    _candidate,
    _Scored,
    expected_regret,
    search_range,
    surrogate_search,
)
from peg.source import Source
from peg.train import train

GRID = (1e-3, 1e-2, 1e-1, 1.0)


def test_the_interpolant_passes_through_its_nodes_and_reproduces_a_polynomial():
    g = torch.Generator().manual_seed(0)
    c0, c1, c2 = (torch.randn(3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))

    def curve(s: float) -> torch.Tensor:
        return c0 + s * c1 + s * s * c2

    f = Interpolant(curve(0.0))
    assert f.degree == 0 and torch.equal(f(0.7), c0)  # one node: constant
    f.add(0.01, curve(0.01))
    torch.testing.assert_close(f(0.005), c0 + 0.005 * (c1 + 0.01 * c2))  # the secant
    f.add(0.3, curve(0.3))
    for s in (0.0, 0.01, 0.3):  # through every node
        torch.testing.assert_close(f(s), curve(s))
    for s in (0.05, 1.0, 3.0):  # degree 2 from 3 nodes: the quadratic itself, anywhere
        torch.testing.assert_close(f(s), curve(s))


def _members(optimum_width: float = 0.0):
    """Member logits `[M, N, C]` that are exact quadratics in the scale, and labels: spreading
    the members helps up to a point (an over-confident base), then hurts."""
    g = torch.Generator().manual_seed(1)
    M, N, C = 8, 400, 5
    y = torch.randint(0, C, (N,), generator=g)
    base = 6.0 * torch.nn.functional.one_hot(torch.randint(0, C, (N,), generator=g), C).float()
    spread = torch.randn(M, N, C, generator=g)
    bend = optimum_width * torch.randn(M, N, C, generator=g)

    def at(s: float) -> torch.Tensor:
        return base + s * spread + s * s * bend

    return at, y


def _nll(logits, y):
    return float(POINT_LOSSES["nll"](logits, y).mean())


_point = POINT_LOSSES["nll"]


def _search(at, y, exact=None, point=_point, **options):
    """`surrogate_search` on whole-tensor member outputs `at(scale)` `[M, N, C]`."""
    if exact is None:
        exact = at

    def chunk(scale, start, stop):
        out = exact(scale)
        return None if out is None else out[:, start:stop]

    zero = lambda start, stop: at(0.0)[:, start:stop]  # noqa: E731
    return surrogate_search(chunk, zero, y, _nll, point, GRID, **options)


def test_on_exact_quadratics_the_choice_is_the_dense_optimum_in_at_most_three_scorings():
    at, y = _members(optimum_width=0.5)
    calls = []

    def exact(s: float) -> torch.Tensor:
        calls.append(s)
        return at(s)

    result = _search(at, y, exact, max_scorings=3, settle=Settle(first=len(y)))
    assert 1 <= len(calls) <= 3 and len(calls) == len(set(calls)) == len(result.scores)
    assert calls[0] == min(GRID)  # the grid's lowest scale first
    assert result.scale in result.scores  # chosen among the scales scored exactly
    assert result.scores[result.scale] == min(result.scores.values())
    lo, hi = search_range(GRID)
    dense = torch.logspace(lo / math.log(10), hi / math.log(10), 400).tolist()
    losses = {s: POINT_LOSSES["nll"](at(s), y).double() for s in dense}
    best = min(losses, key=lambda s: float(losses[s].mean()))
    d = POINT_LOSSES["nll"](at(result.scale), y).double() - losses[best]
    assert float(d.mean()) <= float(d.std()) / math.sqrt(len(d))  # within one standard error
    assert result.predicted  # the interpolant's criterion, for plotting


def test_a_flat_criterion_stops_after_one_scoring():
    at, y = _members()
    calls = []
    flat = lambda s: (calls.append(s), at(0.0))[1]  # noqa: E731  (no scale changes anything)
    result = _search(at, y, flat)
    assert calls == [min(GRID)] and result.scale == min(GRID)


def test_the_budget_is_never_exceeded_and_diverged_scales_lose():
    at, y = _members(optimum_width=0.5)
    calls = []

    def exact(s: float) -> torch.Tensor | None:
        calls.append(s)
        return None if s > 0.05 else at(s)  # diverges above 0.05

    for budget in (1, 2, 3):
        calls.clear()
        result = _search(at, y, exact, point=None, max_scorings=budget)
        assert len(calls) == len(result.scores) <= budget
        assert math.isfinite(result.scores[result.scale]) and result.scale <= 0.05
        assert all(v == math.inf for s, v in result.scores.items() if s > 0.05)


def _scoring_points(p, val):
    X, y = val
    _, score = p._split(Source(val).rows())
    return (X, y) if score is None else (X[score], y[score])


@pytest.mark.parametrize(
    "make",
    [
        lambda: peg.PEG(n_members=8, grad_batch_size=32),
        lambda: peg.PEG(n_members=8, grad_batch_size=32, params="last_layer"),
        lambda: peg.PEP(n_members=8),
    ],
    ids=["peg", "peg-last-layer", "pep"],
)
def test_the_choice_on_a_small_base_is_within_one_se_of_a_dense_search(
    overfit_mlp, moons_data, make
):
    """The default search's scale scores within one standard error (paired, per point) of the
    best of 25 log-spaced scales over the grid's range, each scored exactly on every point."""
    p = make().fit(overfit_mlp, moons_data["val"])
    assert 1 <= len(p.search_) <= 2
    Xs, ys = _scoring_points(p, moons_data["val"])

    def losses(scale: float) -> torch.Tensor:
        logits = p.ensemble_at(scale).member_logits(Xs, 512, progress=False)
        return POINT_LOSSES["nll"](logits, ys).double()

    grid = p.default_grid
    dense = torch.logspace(math.log10(min(grid)), math.log10(max(grid)), 25).tolist()
    reference = {s: losses(s) for s in dense}
    best = min(reference, key=lambda s: float(reference[s].mean()))
    scale = p.eta_ if isinstance(p, peg.PEG) else p.sigma_
    d = losses(scale) - reference[best]
    assert float(d.mean()) <= float(d.std()) / math.sqrt(len(d))


def test_the_regression_search_uses_the_mixture_nll_per_point():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(400, 1, generator=g) * 6 - 3
    y = torch.sin(X[:, 0]) + 0.1 * torch.randn(400, generator=g)
    torch.manual_seed(0)
    model = peg.models.RegressionMLP(1, hidden=32)
    train(model, (X, y), epochs=30, lr=0.01, optimizer="adam", progress=False,
          loss=gaussian_nll_loss)  # fmt: skip
    p = peg.PEG(n_members=6, grad_batch_size=32).fit(model.eval(), (X, y))
    assert 1 <= len(p.search_) <= 2 and p.search_[p.eta_] == min(p.search_.values())
    assert p.meta_["search"] == "surrogate"


@pytest.mark.parametrize("setting", ["bases", "refresh", "last-layer"])
def test_the_zero_node_is_every_members_own_base(setting, overfit_mlp, moons_data, bn_net):
    """The search's node at scale 0 (one forward per base, mapped to the members) equals the
    members themselves at scale 0: several bases, refreshed BatchNorm, a head after a trunk."""
    from conftest import mlp

    X, y = moons_data["val"]
    if setting == "bases":
        p = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1)
        p.fit([mlp(s).eval() for s in range(3)], (X, y))
    elif setting == "refresh":
        p = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1, bn="refresh")
        p.fit(bn_net, (X, y % 3), bn_data=X)
    else:
        p = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1, params="last_layer")
        p.fit(overfit_mlp, (X, y))
    target = p.members_.search_target(X[:100], 50)
    zero = target.bases().member_logits(target.inputs, 50)[torch.tensor(target.member_base)]
    expected = target.at(0.0).member_logits(target.inputs, 50)
    assert len(target.member_base) == len(p) and zero.shape == expected.shape
    torch.testing.assert_close(zero, expected, rtol=1e-5, atol=1e-5)


def _paired(second: torch.Tensor, n: int = 400):
    """A search whose per-point loss is the members' mean output `[M, N, 1]`: 1 at scale 0,
    0.5 at the grid's lowest scale (so the linear interpolant sends the second scoring to the
    top of the range), `second` `[N]` at any other scale; the exact calls, by chunk."""
    calls: list[tuple[float, int, int]] = []

    def exact(scale, start, stop):
        calls.append((scale, start, stop))
        values = torch.full((n,), 0.5) if scale == min(GRID) else second
        return values[start:stop].expand(3, -1).unsqueeze(-1)

    def losses(outputs, y):
        return outputs.mean(0)[:, 0]

    def zero(start, stop):
        return torch.ones(3, stop - start, 1)

    def run(**options):
        calls.clear()
        y = torch.zeros(n, dtype=torch.long)
        criterion = lambda outputs, y: float(losses(outputs, y).mean())  # noqa: E731
        options = {"max_scorings": 2, **options}  # the pair: the first scale and the second
        return surrogate_search(exact, zero, y, criterion, losses, GRID, **options)

    return run, calls


def test_a_clearly_separated_pair_is_decided_on_the_first_chunk():
    alternating = torch.tensor([0.01, -0.01]).repeat(200)
    run, calls = _paired(0.2 + alternating)  # 0.3 better than the first scale, SE ~0.0005
    result = run(settle=Settle(first=50))
    assert len(result.scores) == 2 and set(result.points.values()) == {50}
    assert [stop for _, _, stop in calls] == [50, 50]  # one chunk each, nothing grown
    assert result.scale != min(GRID) and result.scores[result.scale] == pytest.approx(0.2)


def test_a_tie_that_could_matter_is_scored_up_to_the_cap():
    """Per point 0.5 ± 0.1 against 0.5: the mean difference is 0 on every chunk, never 2 SE from
    0, and its interval (±0.2/√n) never within ±0.001 nats: every point is scored."""
    run, calls = _paired(0.5 + torch.tensor([0.1, -0.1]).repeat(200))
    result = run(settle=Settle(first=50, regret=0.0))  # the z and nats rules alone
    assert len(result.scores) == 2 and set(result.points.values()) == {400}
    # both scales on each chunk, the points doubling up to the cap
    chunks = [(0, 50), (50, 100), (100, 200), (200, 400)]
    assert [(start, stop) for _, start, stop in calls] == [c for c in chunks for _ in (1, 2)]
    # a tie within ±0.5 nats cannot matter
    flat = run(settle=Settle(first=50, nats=0.5, regret=0.0))
    assert set(flat.points.values()) == {50}


def test_a_difference_surely_below_the_tie_threshold_stops():
    run, _ = _paired(torch.full((400,), 0.5 - 1e-4))
    result = run(settle=Settle(first=50))  # d = -1e-4 exactly: SE 0, below 0.001 nats
    assert set(result.points.values()) == {50}
    assert Settle().settled(torch.full((8,), 1e-4)) and not Settle(nats=1e-5, regret=0.0).settled(
        torch.tensor([1e-4, -1e-4] * 4)
    )


def test_the_stopping_rule_s_defaults_are_the_scale_search_s():
    """`Settle()` (what `surrogate_search` takes without `settle=`) is the rule the default
    `ScaleSearch` builds: 1024 first points, 2 SE, 0.001 nats, an expected regret of 0.001."""
    s = peg.ScaleSearch()
    built = Settle(s.first_points, s.settle_se, s.settle_nats, s.settle_regret)
    assert Settle() == built == Settle(first=1024, z=2.0, nats=1e-3, regret=1e-3)


def test_the_expected_regret_of_a_choice():
    assert expected_regret(0.0, 1.0) == pytest.approx(1 / math.sqrt(2 * math.pi))
    assert expected_regret(2.0, 1.0) == pytest.approx(0.00849, abs=1e-5)
    assert expected_regret(-2.0, 1.0) == expected_regret(2.0, 1.0)
    assert expected_regret(0.3, 0.0) == 0.0 and expected_regret(0.0, math.inf) == math.inf


def test_a_noisy_tie_that_cannot_cost_stops_on_the_first_chunk():
    """Per point 0.5 ± 0.01 against 0.5 (issue 49): on 50 points d̄ = 0, se ≈ 0.0014, so the
    tie is not surely within ±0.001 nats (d̄ + 2 se ≈ 0.003) and the rule without the regret
    scores every point; taking either costs 0.4 se ≈ 0.0006 nats in expectation."""
    run, _ = _paired(0.5 + torch.tensor([0.01, -0.01]).repeat(200))
    assert set(run(settle=Settle(first=50, regret=0.0)).points.values()) == {400}
    assert set(run(settle=Settle(first=50, regret=1e-3)).points.values()) == {50}
    assert set(run(settle=Settle(first=50, regret=1e-4)).points.values()) == {400}


def test_the_search_scores_at_most_its_budget_of_scales():
    at, y = _members(optimum_width=0.5)
    scales: set[float] = set()

    def exact(s: float) -> torch.Tensor:
        scales.add(s)
        return at(s)

    result = _search(at, y, exact, max_scorings=2)
    assert len(scales) == len(result.scores) <= 2 and result.scale in scales
    three = _search(at, y)  # the default budget: 3
    assert len(three.scores) == 3  # this curve takes a third scoring where it is allowed
    assert peg.ScaleSearch().scorings == 3


def _one_node(gain: torch.Tensor, first: int = 50, grow: bool = True):
    """`_candidate` on a search that scored one scale (0.001, per-point loss 0.5) and whose
    candidate, at half of it, is predicted to gain `gain` `[400]` per point (the interpolant
    halfway between the base's outputs and the scale's); on the first `first` points."""
    exact = lambda s, a, b: torch.full((3, b - a, 1), 0.5)  # noqa: E731
    zero = lambda a, b: (0.5 - 2 * gain)[a:b].expand(3, -1).unsqueeze(-1)  # noqa: E731
    losses = lambda outputs, y: outputs.mean(0)[:, 0]  # noqa: E731
    criterion = lambda outputs, y: float(losses(outputs, y).mean())  # noqa: E731
    done = _Scored(exact, zero, torch.zeros(400, dtype=torch.long), criterion, first)
    done.record(1e-3, exact(1e-3, 0, first))
    settle = Settle(first=first, grow=grow)
    return lambda: _candidate(done, done.interpolant(), 5e-4, losses, settle), done


def test_a_candidate_within_noise_that_could_matter_is_asked_about_on_more_points():
    """Predicted gain 0 ± 0.1 per point: on 50 points within half a standard error (se 0.014)
    but its expected improvement (0.4 se ≈ 0.006 nats) could matter: more points, not a tie;
    on every point (or with `grow=False`, the rule before) a tie."""
    noise = torch.tensor([0.1, -0.1]).repeat(200)
    ask, done = _one_node(noise)
    assert ask() == UNSURE
    done.grow(400)
    assert ask() == STOP  # every point scored: within noise is a tie
    assert _one_node(noise, grow=False)[0]() == STOP
    assert _one_node(noise + 0.05)[0]() == SCORE  # a gain of 0.05 ± 0.014: scored
    assert _one_node(noise * 1e-3)[0]() == STOP  # within noise and surely below 0.001 nats
    assert _one_node(noise - 0.05)[0]() == STOP  # surely worse: improvement below 0.001


def test_the_presets_of_the_scale_search():
    exhaustive, quick = peg.ScaleSearch.exhaustive(), peg.ScaleSearch.quick()
    assert (exhaustive.exact_points, exhaustive.first_points, exhaustive.scorings) == (
        1024,
        1024,
        3,
    )
    assert (quick.scorings, quick.unsure, quick.first_points) == (2, "stop", 384)
    assert peg.ScaleSearch.exhaustive(scorings=4).scorings == 4  # options override
    # the default's first chunk is the cap: up to the cap it is the exhaustive search
    assert peg.ScaleSearch().get_params() == exhaustive.get_params()
    with pytest.raises(peg.InvalidParameterError, match="unsure"):
        peg.ScaleSearch(unsure="more")
