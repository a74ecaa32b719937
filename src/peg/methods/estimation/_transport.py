"""An exact transportation solver for few destinations: `m` points, each sent to one of `C`
classes, class c receiving exactly `counts[c]` points, at the least total `cost[i, label_i]`.

It is the assignment problem with each class's column repeated `counts[c]` times (what
scipy's `linear_sum_assignment` solves in O(m³)), but the flow lives on C nodes. A warm start
(`_prices`: a few sweeps of exact coordinate ascent on the C class prices of the dual) puts
every point at its cheapest class after the prices, so the reduced costs are all ≥ 0 and
most counts already hold; then successive shortest paths (Ahuja, Magnanti & Orlin 1993,
§9.7) move points from the classes over their count to those under it: Dijkstra (scipy's
csgraph) on the C × C graph whose edge c → c' costs the least change of moving a point now
in c to c' (`_row`), the potentials keeping its weights ≥ 0, and along each path every
point tied for an edge's least cost can move at once (repeated rows, saturated softmax
vectors). Exact, not an approximation: only floating-point rounding separates its total
from the assignment's (ties are broken otherwise than scipy's: the total is the same, the
per-point costs may differ). Cost: O(m·C²) per price sweep plus O(C² + m·C) per path, the
paths few after the prices (5 ms for m = 1,000, C = 10 where the assignment took 0.1-0.5 s).
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from peg.errors import InvalidParameterError

#: the price sweeps before the shortest paths (`_prices`): 3 leave at most a few points of
#: 1,000-10,000 to move on CIFAR-10 softmax vectors; more cost O(m·C²) each and rarely help
SWEEPS = 3


def transport_labels(cost: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The class `[m]` of each point in an optimal plan. `cost` `[m, C]` finite floats,
    `counts` `[C]` non-negative integers summing to m."""
    m, C = cost.shape
    if counts.sum() != m or (counts < 0).any():
        raise InvalidParameterError(f"counts: non-negative, summing to {m}; got {counts}")
    if m == 0 or C == 1:
        return np.zeros(m, dtype=np.int64)
    prices = _prices(cost, counts)
    labels = (cost - prices).argmin(1)
    excess = np.bincount(labels, minlength=C) - counts
    # potentials: cost[i, c'] − cost[i, c] + phi[c] − phi[c'] ≥ 0 for i in c (each point is
    # at its cheapest class after the prices), ≤ 0 so that the super-source's edges are too
    phi = prices - prices.max()
    W = np.full((C, C), np.inf)
    for c in range(C):
        _row(cost, labels, c, W)
    while (excess > 0).any():
        # Dijkstra from a super-source (node C) whose edges reach the classes over their count
        graph = np.full((C + 1, C + 1), np.inf)
        graph[:C, :C] = np.maximum(W + phi[:, None] - phi[None, :], 0.0)  # ≥ 0 but rounding
        graph[C, :C] = np.where(excess > 0, -phi, np.inf)
        dist, pred = dijkstra(_sparse(graph), indices=C, return_predecessors=True)
        dist = dist[:C]
        # the sink: the class under its count nearest in true cost (dist + phi)
        t = int(np.argmin(np.where(excess < 0, dist + phi, np.inf)))
        path, v = [], t
        while pred[v] != C:
            path.append((int(pred[v]), v))
            v = int(pred[v])
        # every point tied for an edge's cheapest move can take it: move as many at once
        tied = [_tied(cost, labels, a, b, W[a, b]) for a, b in path]
        amount = min(excess[v], -excess[t], *(len(points) for points in tied))
        excess[v] -= amount
        excess[t] += amount
        for (_, b), points in zip(path, tied, strict=True):
            labels[points[:amount]] = b
        phi += dist  # every class is reached: one with a point has edges to all
        for c in {t} | {a for a, _ in path}:
            _row(cost, labels, c, W)
    return labels


def _prices(cost: np.ndarray, counts: np.ndarray, sweeps: int = SWEEPS) -> np.ndarray:
    """Class prices `[C]` from a few sweeps of exact coordinate ascent on the dual (each
    price in turn set so that exactly `counts[c]` points find c cheapest, the others fixed):
    a warm start that leaves few or no points for the shortest paths to move."""
    m, C = cost.shape
    prices, last = np.zeros(C), m + 1
    for _ in range(sweeps):
        for c in range(C):
            rest = cost - prices
            rest[:, c] = np.inf
            h = cost[:, c] - rest.min(1)  # point i takes c iff prices[c] > h[i]
            k = int(counts[c])
            if k in (0, m):
                prices[c] = h.min() - 1.0 if k == 0 else h.max() + 1.0
            else:
                part = np.partition(h, (k - 1, k))
                prices[c] = 0.5 * (part[k - 1] + part[k])
        excess = np.maximum(np.bincount((cost - prices).argmin(1), minlength=C) - counts, 0)
        if excess.sum() == 0 or excess.sum() >= last:  # done, or ties stall it
            break
        last = excess.sum()
    return prices


def _tied(cost: np.ndarray, labels: np.ndarray, a: int, b: int, w: float) -> np.ndarray:
    """The points now in class a whose move to b costs exactly `w` (the edge's cheapest)."""
    members = np.flatnonzero(labels == a)
    return members[cost[members, b] - cost[members, a] == w]


def _sparse(graph: np.ndarray) -> csr_matrix:
    """The finite entries of `graph` as edges, zeros included (csgraph reads a dense zero as
    no edge, an explicitly stored one as an edge of weight 0)."""
    rows, cols = np.nonzero(np.isfinite(graph))
    indptr = np.searchsorted(rows, np.arange(len(graph) + 1))
    return csr_matrix((graph[rows, cols], cols, indptr), shape=graph.shape)


def _row(cost: np.ndarray, labels: np.ndarray, c: int, W: np.ndarray) -> None:
    """Class c's row of the move graph: `W[c, c']` the least cost change of moving one of its
    points to c' (all inf when c has no point)."""
    members = np.flatnonzero(labels == c)
    delta = cost[members] - cost[members, c][:, None]
    W[c] = delta.min(0) if len(members) else np.inf
    W[c, c] = np.inf
