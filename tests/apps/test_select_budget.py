"""`AutoSelect` keeps its budget (issue 49, 2): the reference TS fit is timed after the one-time
costs, every candidate is priced before it starts, one running past the budget is stopped."""

from __future__ import annotations

import re
import threading
import time

import pytest
import torch
from torch import nn

from peg.apps.bench.spec import MethodSpec
from peg.apps.select import AutoSelect, auto, race, reference
from peg.apps.select.deadline import Overrun, stop_at
from peg.apps.select.race import FIT_PASSES, Plan, full_map_factor

FIRST = [0.6]  # the process's first forward costs this much more (lazy initialisation)


class SlowFirst(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(FIRST.pop()) if FIRST else None
        return super().forward(x)


def test_the_reference_excludes_one_time_costs_and_the_ratio_is_the_real_one(monkeypatch):
    """A slow first forward and a slow candidate lookup (as laplace-torch's import was: 2.35 s
    for a 0.1 s TS fit) land in `setup_seconds`, not in the reference; `times_reference` is the
    whole fit's wall time over that reference."""
    resolve = auto.resolve
    monkeypatch.setattr(auto, "resolve", lambda *a: time.sleep(0.6) or resolve(*a))
    g = torch.Generator().manual_seed(0)
    z = torch.randn(400, 3, generator=g)
    y = torch.multinomial((2 * z).softmax(-1), 1, generator=g)[:, 0]
    model = SlowFirst(3, 3).eval()
    with torch.no_grad():
        model.weight.copy_(3.0 * torch.eye(3))
        model.bias.zero_()
    started = time.perf_counter()
    sel = AutoSelect(candidates=["TS"], cv=2, progress=False).fit(model, (z, y))
    wall = time.perf_counter() - started
    cost = sel.cost_
    assert cost["reference_seconds"] < 0.5, cost  # 1.2 s more before the fix
    assert cost["setup_seconds"] >= 1.2
    assert cost["seconds"] <= wall and cost["seconds"] >= 0.9 * wall
    assert abs(cost["times_reference"] * cost["reference_seconds"] - cost["seconds"]) < 1e-9
    assert "one-time setup" in sel.to_markdown()


class _Cross:
    """What `race.Plan` reads of a `CrossFit`."""

    def __init__(self, specs: list[MethodSpec], seconds: dict[str, float], points) -> None:
        self.order = specs
        self.steps = {s.name: [seconds[s.name]] if s.name in seconds else [] for s in specs}
        self.base_of = {s.name: s.base for s in specs}
        self.dropped: dict[str, str] = {}
        self.points, self.gaps = points, {}

    def cheap(self, name: str) -> bool:
        return name not in ("PEG", "Last-layer PEG")


MAPS = [MethodSpec("TS", "temperature", "model"),
        MethodSpec("Vector scaling", "vector-scaling", "model"),
        MethodSpec("Dirichlet", "dirichlet", "model")]  # fmt: skip


def test_a_full_map_is_priced_by_its_c_squared_parameters_before_it_starts():
    """1,000 classes: Dirichlet's first fold cost 19.3 s against vector scaling's 0.215 s, and
    was started on vector scaling's price (then 20.4 s against a 10 s budget)."""
    assert full_map_factor(10) == full_map_factor(100) == 2.0 and full_map_factor(1000) == 100
    points = {s.name: torch.zeros(10) for s in MAPS}
    cross = _Cross(MAPS, {"TS": 0.05, "Vector scaling": 0.215}, points)
    why = Plan(10.0, None, time.perf_counter(), print, classes=1000).admit(cross, MAPS[2], 5)
    assert why is not None and "at a price of 21.5 s each" in why
    plan = Plan(10.0, None, time.perf_counter(), print, classes=100)
    assert plan.admit(cross, MAPS[2], 5) is None


def test_a_network_candidate_is_priced_by_its_members_forward_passes():
    """Before any network candidate has run: PEG (15 members) at 15 forward passes of val."""
    specs = [MAPS[0], MethodSpec("Last-layer PEG", "peg", "model", {"params": "last_layer"}),
             MethodSpec("PEG", "peg", "model")]  # fmt: skip
    cross = _Cross(specs, {"TS": 0.05}, {s.name: torch.zeros(10) for s in specs})
    plan = Plan(10.0, None, time.perf_counter(), print, forward=0.2)
    assert plan.admit(cross, specs[1], 5) is None  # 5 × (1 + FIT_PASSES) × 0.2 s
    why = plan.admit(cross, specs[2], 5)  # 5 × (15 + FIT_PASSES) × 0.2 s
    assert why is not None and f"at a price of {(15 + FIT_PASSES['peg']) * 0.2:.3g} s each" in why


def test_a_leader_running_past_the_budget_is_stopped_at_the_next_fold():
    """A leader whose first fold alone passed the budget is dropped after it, saying so (the
    first candidate, TS, stays: the choice is made among the candidates scored on every fold)."""
    n = 40
    points = {"TS": torch.full((n,), 0.5, dtype=torch.float64),
              "Vector scaling": torch.full((n,), 0.45, dtype=torch.float64),
              "Dirichlet": torch.full((n,), 0.4, dtype=torch.float64)}  # fmt: skip
    cross = _Cross(MAPS, {"TS": 0.01, "Vector scaling": 0.02, "Dirichlet": 19.3}, points)
    folds = list(torch.arange(n).chunk(5))
    Plan(10.0, None, time.perf_counter(), lambda _: None).after_fold(cross, folds, 0)
    assert set(cross.dropped) == {"Dirichlet"}
    assert cross.dropped["Dirichlet"].startswith("over budget after fold 1: 4 more folds at 19.3")


class SlowForward(nn.Linear):
    """A model whose every forward pass takes `DELAY` seconds: a network candidate's folds are
    forward passes, so its cost is known from the count."""

    DELAY = 0.02

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.DELAY)
        return super().forward(x)


def _slow_problem(n: int = 600):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(n, 3, generator=g) * 2.0
    y = torch.multinomial(z.softmax(-1), 1, generator=g)[:, 0]
    model = SlowForward(3, 3).eval()
    with torch.no_grad():
        model.weight.copy_(3.0 * torch.eye(3))
        model.bias.zero_()
    return model, (z, y)


def _built(monkeypatch) -> list[str]:
    """The registry keys built from here on (a candidate started is a candidate built)."""
    from peg.apps import registry

    built: list[str] = []
    build = registry.build
    monkeypatch.setattr(registry, "build", lambda key, *a, **k: built.append(key) or build(
        key, *a, **k))  # fmt: skip
    return built


def test_a_network_candidate_priced_over_the_budget_is_not_started_and_says_why(monkeypatch):
    """PEG-15's price is its members' and its fit's forward passes of val (15 + `FIT_PASSES`):
    at 0.02 s a pass and cv=2, over a 0.8 s budget, so it is never built; its row says why."""
    model, val = _slow_problem()
    built = _built(monkeypatch)
    sel = AutoSelect(candidates=["TS", "PEG"], cv=2, max_fit_seconds=0.8, progress=False)
    rows = {r["candidate"]: r for r in sel.fit(model, val).report_}
    assert "peg" not in built and sel.chosen_ == "TS"
    assert rows["PEG"]["status"] == "dropped" and rows["PEG"]["fold_seconds"] == []
    why = rows["PEG"]["why"]
    assert re.match(r"not started: budget 0.8 s \(.*at a price of [\d.]+ s each", why), why


def test_the_nested_inner_runs_are_priced_as_the_outer_one(monkeypatch):
    """nested=True: each outer fold's selection runs under the same budget and prices; PEG,
    not started in the outer run, is not started in an inner one either (they priced a network
    candidate at 0 before: PEG-15 fitted 3 times, each past the budget)."""
    model, val = _slow_problem()
    built = _built(monkeypatch)
    sel = AutoSelect(candidates=["TS", "PEG"], cv=2, max_fit_seconds=0.8, nested=True,
                     progress=False).fit(model, val)  # fmt: skip
    assert "peg" not in built
    assert sel.nested_ is not None and sel.nested_["chosen"] == ["TS", "TS"]


def test_a_fold_past_its_share_of_the_budget_is_stopped_mid_fold(monkeypatch):
    """A network candidate priced far too low (started) is stopped at a forward pass once its
    fold passes its share of the budget, not after the fold: the fit stays near its budget,
    the row says so, and the model is as it was (the candidates fit copies of it)."""
    monkeypatch.setattr(race.Plan, "_prior", lambda *_: 0.0)  # PEG priced at nothing
    monkeypatch.setattr(SlowForward, "DELAY", 0.1)  # a PEG-15 fold: ~20 passes, >= 2 s
    model, val = _slow_problem()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sel = AutoSelect(candidates=["TS", "PEG"], cv=2, max_fit_seconds=1.5, progress=False)
    rows = {r["candidate"]: r for r in sel.fit(model, val).report_}
    spent = sel.cost_["seconds"] - sel.cost_["setup_seconds"]  # the budget's clock
    assert rows["PEG"]["why"].startswith("stopped in fold 1: over budget"), rows["PEG"]["why"]
    assert sel.chosen_ == "TS" and spent < 1.5 + 1.0  # a whole PEG-15 fold: >= 2 s more
    # untouched, not recomputed: no arithmetic ran on these tensors, so the same bits
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_deadline_is_checked_at_every_module_forward_and_removed_after():
    layer = nn.Linear(2, 2)
    with pytest.raises(Overrun), stop_at(0.05):
        for _ in range(100):
            time.sleep(0.01)
            layer(torch.zeros(1, 2))
    layer(torch.zeros(1, 2))  # the hook is gone
    with stop_at(None):
        time.sleep(0.01)
        layer(torch.zeros(1, 2))


def test_the_deadline_stops_only_the_thread_that_set_it():
    """The hook is process-wide: a forward in another thread (a user's server, a loader
    thread) past the deadline runs on; only the fold's own thread is stopped."""
    layer = nn.Linear(2, 2)
    errors: list[BaseException] = []

    def other() -> None:
        try:
            layer(torch.zeros(1, 2))
        except BaseException as e:  # any escape, Overrun included, is the failure
            errors.append(e)

    with pytest.raises(Overrun), stop_at(0.0):
        time.sleep(0.01)
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        layer(torch.zeros(1, 2))
    assert errors == []


def test_a_fold_s_share_of_the_budget_owes_only_the_started_candidates():
    """On the first fold the candidates after it are not admitted yet: their prices are not
    owed (they were, and every map of the Fashion-MNIST run was stopped at a share of -29 s);
    on a later fold every kept one is, those after it in this fold once more."""
    specs = [*MAPS, MethodSpec("PEG", "peg", "model")]
    cross = _Cross(specs, {"TS": 0.05}, {s.name: torch.zeros(10) for s in specs})
    plan = Plan(10.0, None, time.perf_counter(), print, forward=1.0)  # PEG: 18 s a fold
    assert plan.allowance(cross, specs[0], 0, 5) is None  # the first candidate: never stopped
    assert 1.9 < plan.allowance(cross, specs[1], 0, 5) <= (10 - 4 * 0.05) / 5
    cross.steps.update({"Vector scaling": [0.1], "Dirichlet": [0.2], "PEG": [1.0]})
    owed = 3 * (0.05 + 0.2 + 1.0) + (0.2 + 1.0)  # 3 folds left; Dirichlet and PEG in this one
    assert (10 - owed) / 4 - 0.05 < plan.allowance(cross, specs[1], 1, 5) <= (10 - owed) / 4


def test_a_chained_candidate_whose_base_did_not_start_is_priced_with_its_base():
    """PEG not started leaves PEG + TS to fit it as its base: its price holds PEG's (it was
    started at a calibrator's price, and PEG fitted for it, past the budget)."""
    specs = [MAPS[0], MethodSpec("PEG", "peg", "model"),
             MethodSpec("PEG + TS", "temperature", "PEG")]  # fmt: skip
    cross = _Cross(specs, {"TS": 0.05}, {s.name: torch.zeros(10) for s in specs})
    plan = Plan(10.0, None, time.perf_counter(), print, forward=0.2)
    cross.dropped["PEG"] = plan.admit(cross, specs[1], 5)
    assert cross.dropped["PEG"] is not None
    why = plan.admit(cross, specs[2], 5)
    assert why is not None and "at a price of" in why


def test_a_full_map_is_priced_from_its_diagonal_map_not_the_other_full_map():
    """Saturated 10-class logits: Dirichlet's first fold 2.8 s, vector scaling's 0.06 s; matrix
    scaling (a tenth of Dirichlet's there) was priced at Dirichlet's fold and not started."""
    specs = [*MAPS, MethodSpec("Matrix scaling", "matrix-scaling", "model")]
    points = {s.name: torch.zeros(10) for s in specs}
    cross = _Cross(specs, {"TS": 0.01, "Vector scaling": 0.06, "Dirichlet": 2.8}, points)
    plan = Plan(15.0, None, time.perf_counter(), print, classes=10)
    assert plan.admit(cross, specs[3], 5) is None  # 5 × 2 × 0.06 s beside 4 × 2.87 s


def test_a_cheap_candidate_starts_where_only_a_dearer_kept_one_stands_in_its_way():
    """Dirichlet's 3.4 s folds (dropped by the trim after the fold) left no room for matrix
    scaling at 0.14 s: it starts; a dearer one than every kept one still does not."""
    specs = [*MAPS, MethodSpec("Matrix scaling", "matrix-scaling", "model")]
    points = {s.name: torch.zeros(10) for s in specs}
    cross = _Cross(specs, {"TS": 0.01, "Vector scaling": 0.07, "Dirichlet": 3.4}, points)
    plan = Plan(10.0, None, time.perf_counter(), print, forward=0.2, classes=10)
    assert plan.admit(cross, specs[3], 5) is None  # 4 × (0.01 + 0.07) + 5 × 0.14 s
    assert plan.allowance(cross, specs[3], 0, 5) > 1.0  # and its fold is not stopped at once
    assert plan.admit(cross, MethodSpec("PEG", "peg", "model"), 5) is not None  # 18 × 0.2 s


# 100 classes, 5,000 points, one thread, quiet (benchmarks/auto_select_logits.py's case): the
# reference TS fit and each map's fold (fit and scoring, seconds), and their CV NLL
QUIET = {"TS": 0.24, "Ensemble TS": 0.35, "Vector scaling": 0.72, "Order-preserving": 0.81,
         "Matrix scaling": 1.8, "Dirichlet": 3.9}  # fmt: skip
CV_NLL = {"TS": 0.628, "Ensemble TS": 0.583, "Vector scaling": 0.561, "Order-preserving": 0.577,
          "Matrix scaling": 0.561, "Dirichlet": 0.574}  # fmt: skip


def _first_fold(load: float) -> _Cross:
    """The first fold of the 100-class case on a machine `load` times slower (the reference TS
    fit too: the budget `max(25 × reference, 10 s)`), on a simulated clock: each map admitted
    costs its fold; then the trim after the fold."""
    from peg.apps.compare.methods import LOGIT_METHODS, resolve

    specs = race.cheap_first(resolve(list(LOGIT_METHODS), nn.Identity())[0], lambda s: True)
    n = 5000  # the case's points: what a map's predicted fold (`race.predicted_fold`) reads
    points = {s.name: torch.full((n,), CV_NLL[s.name], dtype=torch.float64) for s in specs}
    cross = _Cross(specs, {}, points)
    spent = [0.45 * load]  # the validation pass and the reference
    plan = Plan(max(25 * 0.45 * load, 10.0), 3.0, 0.0, lambda _: None, classes=100)
    plan.elapsed = lambda: spent[0]  # type: ignore[method-assign]
    for spec in specs:
        why = plan.admit(cross, spec, 5)
        if why is None:
            spent[0] += QUIET[spec.name] * load
            cross.steps[spec.name] = [QUIET[spec.name] * load]
        else:
            cross.dropped[spec.name] = why
    plan.after_fold(cross, list(torch.arange(n).chunk(5)), 0)
    return cross


@pytest.mark.parametrize("load", [1.0, 2.2, 4.0])
def test_the_simple_map_is_admitted_whatever_the_load(load):
    """At load average ~11 (folds and reference 2.2 × slower) vector scaling, the exhaustive
    run's choice, was priced at order-preserving's fold (admitted before it) and not started:
    +0.013 nats. Admitted by value per cost, it starts and stays at any load; what is left out
    is the dearer, worse maps."""
    cross = _first_fold(load)
    assert "Vector scaling" not in cross.dropped, cross.dropped
    assert {"Dirichlet", "Matrix scaling"} <= set(cross.dropped)
    names = [s.name for s in cross.order]
    assert names.index("Vector scaling") < names.index("Order-preserving")


def test_the_trim_drops_the_worse_of_two_maps_either_of_whose_drop_would_do():
    """Two kept maps, either one's drop enough for the budget, the better one's fold dearer by
    the load's noise: the worse scored one is dropped (it was the dearer one, the better map)."""
    specs = [MAPS[0], MethodSpec("Ensemble TS", "ensemble-temperature", "model"), MAPS[1],
             MethodSpec("Order-preserving", "order-preserving", "model")]  # fmt: skip
    n = 50
    means = {"TS": 0.63, "Ensemble TS": 0.55, "Vector scaling": 0.56, "Order-preserving": 0.58}
    points = {k: torch.full((n,), v, dtype=torch.float64) for k, v in means.items()}
    seconds = {"TS": 0.2, "Ensemble TS": 0.3, "Vector scaling": 0.9, "Order-preserving": 0.8}
    cross = _Cross(specs, seconds, points)
    plan = Plan(9.0, None, 0.0, lambda _: None)
    plan.elapsed = lambda: 2.2  # type: ignore[method-assign]  # + 4 × 2.2 s + the refit: 11.4 s
    plan.after_fold(cross, list(torch.arange(n).chunk(5)), 0)
    assert set(cross.dropped) == {"Order-preserving"}, cross.dropped
    # within one paired SE of each other (a tie so far): the dearer is dropped, as before
    noise = 0.5 * torch.randn(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    points["Order-preserving"] = points["Vector scaling"] + noise - noise.mean() + 0.01
    cross.dropped.clear()
    plan.after_fold(cross, list(torch.arange(n).chunk(5)), 0)
    assert set(cross.dropped) == {"Vector scaling"}, cross.dropped


def test_a_map_is_priced_by_the_maps_of_no_richer_structure():
    """Isotonic (one-vs-rest, O(C)) after Dirichlet at 1,000 classes: priced at the dearest
    O(C) map's fold, not at Dirichlet's 19.3 s."""
    specs = [*MAPS, MethodSpec("Isotonic", "isotonic", "model")]
    points = {s.name: torch.zeros(10) for s in specs}
    cross = _Cross(specs, {"TS": 0.05, "Vector scaling": 0.2, "Dirichlet": 19.3}, points)
    plan = Plan(200.0, None, time.perf_counter(), print, classes=1000)
    assert plan._prior(cross, specs[3]) == pytest.approx(0.2)
    assert plan._prior(cross, MethodSpec("Ensemble TS", "ensemble-temperature", "model")) == 0.05


def test_the_budget_floor_is_in_seconds_of_an_unloaded_machine(monkeypatch):
    """At load average ~10 the saturated 10-class run got 0.4 CPU seconds in 4.5 wall ones: a
    10 s wall floor held a tenth of the work, and the choice went from matrix scaling to TS
    (+0.21 nats). The floor is 10 s × the wall over the CPU seconds of the reference pass: a
    reference run at an eighth of the CPU (simulated) gets ~80 s."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(200, 3, generator=g)
    y = torch.multinomial((2 * z).softmax(-1), 1, generator=g)[:, 0]
    quiet = AutoSelect(candidates=["TS"], cv=2, progress=False).fit(nn.Identity(), (z, y))
    assert quiet.cost_["slowdown"] >= 1.0 and quiet.cost_["budget_seconds"] >= 10.0
    monkeypatch.setattr(time, "process_time", lambda: time.perf_counter() / 8)
    loaded = AutoSelect(candidates=["TS"], cv=2, progress=False).fit(nn.Identity(), (z, y))
    assert loaded.cost_["slowdown"] == pytest.approx(8.0, rel=0.01)
    assert loaded.cost_["budget_seconds"] == pytest.approx(80.0, rel=0.01)  # 10 s before
    assert "at least 10 s × 8 (the load)" in loaded.to_markdown()
    assert reference.slowdown(1.0, 2.0) == 1.0 and reference.slowdown(1.0, 0.0) == 1.0


def test_the_load_factor_is_bounded_and_a_cpu_one():
    """A pass that waited (a loader's workers, a disk: 50 wall seconds on 1 CPU second) does
    not make the floor 500 s, and an accelerator's waits are not the CPU's load."""
    assert reference.slowdown(50.0, 1.0) == reference.MAX_SLOWDOWN
    assert reference.slowdown(4.0, 1.0, torch.device("cpu")) == 4.0
    assert reference.slowdown(4.0, 1.0, torch.device("meta")) == 1.0


def test_known_cheap_maps_are_scored_whatever_the_budget_and_the_clock():
    """10 classes, 2,000 points: the logits maps are known cheap (a few unloaded seconds in
    all), so a budget spent before they start, or folds measured 5 × slower (a loaded
    machine), neither leaves them out nor drops them: one run under load had skipped matrix
    scaling and Dirichlet, the next scored them."""
    specs = [*MAPS, MethodSpec("Matrix scaling", "matrix-scaling", "model")]
    points = {s.name: torch.zeros(2000) for s in specs}
    cross = _Cross(specs, {"TS": 0.5, "Vector scaling": 1.0}, points)
    plan = Plan(0.01, None, time.perf_counter() - 60, print, classes=10)  # 60 s spent of 0.01
    assert plan.admit(cross, specs[2], 5) is None and plan.admit(cross, specs[3], 5) is None
    assert plan.allowance(cross, specs[3], 0, 5) >= race.fold_limit("matrix-scaling", 2000, 10)
    cross.steps |= {"Dirichlet": [2.4], "Matrix scaling": [1.8]}  # 12 × slower: as measured
    plan.after_fold(cross, list(torch.arange(2000).chunk(5)), 0)
    assert cross.dropped == {}
    # not known cheap: 1,000 classes, or a fold far past its prediction
    assert not Plan(0.01, None, 0.0, print, classes=1000).known_cheap(cross, "Dirichlet", 5)
    cross.steps["Dirichlet"] = [30.0]
    assert not plan.known_cheap(cross, "Dirichlet", 5)


def test_at_a_tiny_budget_matrix_scaling_and_dirichlet_are_still_scored():
    g = torch.Generator().manual_seed(0)
    z = 2 * torch.randn(2000, 10, generator=g)
    y = torch.multinomial((0.7 * z).softmax(-1), 1, generator=g)[:, 0]
    sel = AutoSelect(max_fit_seconds=1e-3, progress=False).fit(nn.Identity(), (z, y))
    rows = {r["candidate"]: r for r in sel.report_}
    for name in ("Matrix scaling", "Dirichlet"):
        assert "budget" not in str(rows[name].get("why")), rows[name]
        assert "cv_mean" in rows[name] or "partial_mean" in rows[name], rows[name]
