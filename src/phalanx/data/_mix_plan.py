"""How a mixed dataset's rows are drawn: per global step, how many rows each rank takes from each
source (pure arithmetic on counts; no rows are read here).

Every rank reads its own shard of every source (the sources are split over the ranks as any
dataset is), so a row is trained once whatever the plan says. The plan decides only how many
rows of each source go into each batch. A *global step* is batch ``i`` of every rank together
(``G`` rows: ``world_size x batch_size``). Its count of source ``s`` is ``⌊w_s·G⌋`` or
``⌊w_s·G⌋ + 1`` (so within one row of the target ``w_s·G``): the sources that get the extra row
are those furthest behind their share of the rows given so far in the epoch, so the epoch's
running ratio stays on target too. Each source's rows of the step are then dealt over the
ranks, ``⌊c/W⌋`` or ``⌈c/W⌉`` each, every rank getting exactly ``batch_size`` rows, the extra
rows going to the ranks that have taken least of that source so far (so the ranks' shards of a
source run out together).

Only the counts consumed so far in the epoch (per source) and the shard sizes enter the plan, so
a resumed attempt, at any world size, continues the ratio where the checkpoint left it.

Near the end of a source (some rank's shard of it is empty) the ratio cannot be held: the step
is filled from what is left, each rank from its own shards, by the same weights over the
sources it still has (``STOP_ON_LONGEST_DROP``: the exhausted source drops out, the others go
on). ``STOP_ON_SHORTEST`` ends the epoch after ``min_s ⌊N_s / w_s⌋`` rows, the point where the
shortest source (for its weight) would run out.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from phalanx.data._plan import rank_range

__all__ = ["MixRule", "PassPlan", "apportion", "pass_rows"]

PLAN_CHUNK = 512
"""Steps planned at a time (the plan grows as the pass is read)."""


@dataclass(frozen=True)
class MixRule:
    """The weights (normalized, each > 0) and whether the epoch ends with the shortest source."""

    weights: tuple[float, ...]
    stop_on_shortest: bool

    def epoch_rows(self, source_rows: Sequence[int]) -> int:
        """Rows of a whole mixed epoch over sources of ``source_rows`` rows."""
        if self.stop_on_shortest:
            return int(min(int(n) / w for n, w in zip(source_rows, self.weights)) + 1e-9)
        return int(sum(int(n) for n in source_rows))


def apportion(
    rows: int, weights: np.ndarray, consumed: np.ndarray, available: np.ndarray
) -> np.ndarray:
    """``rows`` split over the sources: ``⌊w·rows⌋`` or one more each (weights renormalized over
    the sources with rows ``available``), the extra rows to the sources furthest behind their
    share of ``consumed`` + this step; a source with fewer rows available gives what it has and
    the rest is split over the others. ``rows`` must not exceed ``available.sum()``.

    >>> apportion(32, np.array([0.75, 0.25]), np.array([0, 0]), np.array([100, 100])).tolist()
    [24, 8]
    >>> apportion(10, np.array([0.5, 0.3, 0.2]), np.array([0, 0, 0]), np.array([9, 1, 9])).tolist()
    [6, 1, 3]
    """
    counts = np.zeros(len(weights), dtype=np.int64)
    free = available > 0
    while True:
        left = rows - int(counts[~free].sum())
        if left <= 0 or not free.any():
            return counts
        w = np.where(free, weights, 0.0)
        v = w / w.sum()
        floors = np.floor(v * left).astype(np.int64)
        extra = left - int(floors[free].sum())
        if extra:
            total = float(consumed[free].sum()) + left
            behind = v * total - consumed - floors
            # furthest behind first; ties: the larger weight, then the lower index
            order = np.lexsort((np.arange(len(v)), -v, -np.where(free, behind, -np.inf)))
            floors[order[:extra]] += 1
        over = free & (floors > available)
        if not over.any():
            counts[free] = floors[free]
            return counts
        counts[over] = available[over]
        free &= ~over


def deal(counts: np.ndarray, batch: int, taken: np.ndarray) -> np.ndarray | None:
    """A full step's ``counts`` (per source) dealt over ranks that each take ``batch`` rows:
    ``⌊c/W⌋`` or ``⌈c/W⌉`` of each source per rank, the extra rows of a source to the ranks that
    have ``taken`` (ranks x sources) least of it. None when ``counts`` do not add up."""
    world = taken.shape[0]
    base = counts // world
    extra = counts - base * world
    per_rank, spare = divmod(int(extra.sum()), world)
    if spare or int(base.sum()) + per_rank != batch:
        return None
    out = np.broadcast_to(base, taken.shape).copy()
    room = np.full(world, per_rank, dtype=np.int64)
    ranks = np.arange(world)
    # the sources with the most extra rows first, each to the ranks with the most room left
    # (Ryser's construction: always completes), ties to the ranks behind on that source
    for s in np.lexsort((np.arange(len(counts)), -extra)):
        need = int(extra[s])
        if not need:
            continue
        chosen = np.lexsort((ranks, taken[:, s], -room))[:need]
        out[chosen, s] += 1
        room[chosen] -= 1
    return out


def pass_rows(
    rule: MixRule, shards: np.ndarray, consumed: np.ndarray, epoch_rows: int, equal: bool
) -> np.ndarray:
    """The rows each rank gives in a pass over its ``shards`` (ranks x sources rows), after
    ``consumed`` rows (per source) of the epoch were given before the pass."""
    have = shards.sum(axis=1)
    if rule.stop_on_shortest:
        left = max(epoch_rows - int(consumed.sum()), 0)
        world = shards.shape[0]
        bounds = [rank_range(left, r, world, equal) for r in range(world)]
        share = np.array([hi - lo for lo, hi in bounds], dtype=np.int64)
        have = np.minimum(have, share)
    if equal and len(have):
        have = np.full_like(have, have.min())
    return have.astype(np.int64)


class PassPlan:
    """The steps of one pass over a mixed shard, for every rank (planned as far as asked).

    ``shards``: the rows of each rank's shard of each source in this pass (ranks x sources);
    ``consumed``: rows of each source consumed in the epoch before the pass (a resumed pass);
    ``rows``: the rows each rank gives in the pass (``pass_rows``); ``batch``: rows per rank per
    step. Thread-safe for one planner (the read-ahead thread) and readers of what is planned.
    """

    def __init__(
        self,
        rule: MixRule,
        shards: np.ndarray,
        consumed: np.ndarray,
        rows: np.ndarray,
        batch: int,
    ) -> None:
        self.rule = rule
        self.weights = np.asarray(rule.weights, dtype=np.float64)
        self.batch = int(batch)
        self._left_in_shard = np.asarray(shards, dtype=np.int64).copy()  # ranks x sources
        self._taken = np.zeros_like(self._left_in_shard)
        self._consumed = np.asarray(consumed, dtype=np.int64).copy()
        self._left = np.asarray(rows, dtype=np.int64).copy()
        self.world = self._left_in_shard.shape[0]
        self.steps = 0
        # per planned chunk: first step, and (steps, ranks, sources) counts
        self._starts: list[int] = []
        self._chunks: list[np.ndarray] = []
        self._lock = threading.Lock()
        self._deals: dict[tuple[tuple[int, ...], _Takings], tuple[list[list[int]], _Takings]] = {}
        self.total_steps = self._count_steps()

    def _count_steps(self) -> int:
        return int(-(-int(self._left.max()) // self.batch)) if self.world else 0

    def counts(self, lo: int, hi: int) -> np.ndarray:
        """Steps ``[lo, hi)`` (planned now if need be): rows per (step, rank, source)."""
        hi = min(hi, self.total_steps)
        with self._lock:
            while self.steps < hi:
                self._plan(PLAN_CHUNK)
        if hi <= lo:
            return np.zeros((0, self.world, len(self.weights)), dtype=np.int64)
        i = bisect.bisect_right(self._starts, lo) - 1
        parts = []
        while i < len(self._starts) and self._starts[i] < hi:
            start, chunk = self._starts[i], self._chunks[i]
            parts.append(chunk[max(lo - start, 0) : hi - start])
            i += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def taken(self, rank: int, steps: int) -> np.ndarray:
        """Rows of each source ``rank`` took in its first ``steps`` steps (planned ones only)."""
        steps = min(steps, self.steps)
        total = np.zeros(len(self.weights), dtype=np.int64)
        for start, chunk in zip(self._starts, self._chunks):
            if start >= steps:
                break
            total += chunk[: steps - start, rank].sum(axis=0)
        return total

    def _plan(self, n: int) -> None:
        out: list[np.ndarray] = []  # (steps, ranks, sources) each
        todo = min(n, self.total_steps - self.steps)
        done = 0
        while done < todo:
            safe = self._safe_steps(todo - done)
            out.append(self._fast_steps(safe) if safe else self._step()[None])
            done += len(out[-1])
        if out:
            self._starts.append(self.steps)
            self._chunks.append(out[0] if len(out) == 1 else np.concatenate(out))
            self.steps += done

    def _safe_steps(self, most: int) -> int:
        """Steps no constraint can bind in: every rank has at least a batch of rows per step
        left of every source not used up, and of its pass."""
        batch = self.batch
        left = self._left_in_shard
        used_up = (left == 0).all(axis=0)
        if len(self.weights) >= 8 or used_up.all():
            return 0
        k = min(int(left[:, ~used_up].min()), int(self._left.min())) // batch
        return min(k, most)

    def _fast_steps(self, k: int) -> np.ndarray:
        """``k`` steps as ``_step`` computes them (the same arithmetic, in plain Python: numpy's
        cost per call dominates on arrays of a few items), where ``_safe_steps`` allows."""
        batch, world = self.batch, self.world
        used_up = (self._left_in_shard == 0).all(axis=0).tolist()
        free = [i for i, u in enumerate(used_up) if not u]
        weights = [0.0 if u else w for w, u in zip(self.weights.tolist(), used_up)]
        wsum = sum(weights)
        v = [w / wsum for w in weights]
        rows = batch * world
        floors = [math.floor(x * rows) for x in v]
        if sum(floors) == rows and all(c % world == 0 for c in floors):
            # whole rows of every source per step, as many for every rank: all k steps alike
            return self._same_steps(k, floors)
        steps = self._extra_rows(k, v, floors, free)
        if world == 1:
            dealt = np.array(steps, dtype=np.int64).reshape(k, 1, len(v))
        else:
            # a deal depends on the counts and on the order of the ranks' takings of each
            # source only: the takings less each source's least (a few states) key a memo
            state = _relative(self._taken.tolist())
            memo = self._deals
            dealt_lists = []
            for counts in steps:
                key = (tuple(counts), state)
                hit = memo.get(key)
                if hit is None:
                    step = _deal_lists(counts, world, [list(t) for t in state])
                    after = [[t + d for t, d in zip(a, b)] for a, b in zip(state, step)]
                    if len(memo) > 4096:
                        memo.clear()
                    hit = memo[key] = (step, _relative(after))
                step, state = hit
                dealt_lists.append(step)
            dealt = np.array(dealt_lists, dtype=np.int64).reshape(k, world, len(v))
        per_source = dealt.sum(axis=0)
        self._left_in_shard -= per_source
        self._taken += per_source
        self._consumed += per_source.sum(axis=0)
        self._left -= k * batch
        return dealt

    def _extra_rows(
        self, k: int, v: list[float], floors: list[int], free: list[int]
    ) -> list[list[int]]:
        """Each of ``k`` steps' rows per source: ``floors``, and the rows left over (fewer than
        the sources) to the sources furthest behind their share of the epoch's rows so far
        (ties: the larger weight, then the lower index), as ``apportion`` gives them."""
        rows = self.batch * self.world
        extra = rows - sum(floors)
        consumed = self._consumed.tolist()
        done = sum(consumed[i] for i in free)  # an int: the float below is exactly _step's
        order_ties = {i: (-v[i], i) for i in free}
        out = []
        first, others = free[0], free[1:]
        for _ in range(k):
            total = float(done) + rows
            counts = list(floors)
            if extra == 1:  # (two sources at most batch sizes): the one furthest behind
                best, most = first, v[first] * total - consumed[first] - floors[first]
                for i in others:
                    b = v[i] * total - consumed[i] - floors[i]
                    if b > most or (b == most and v[i] > v[best]):
                        best, most = i, b
                counts[best] += 1
            else:
                behind = {i: v[i] * total - consumed[i] - counts[i] for i in free}
                for i in sorted(free, key=lambda i: (-behind[i], *order_ties[i]))[:extra]:
                    counts[i] += 1
            for i in free:
                consumed[i] += counts[i]
            done += rows
            out.append(counts)
        return out

    def _same_steps(self, k: int, counts: list[int]) -> np.ndarray:
        """``k`` steps of ``counts`` rows of each source, dealt evenly over the ranks (what
        ``_fast_steps`` gives when no step has an extra row to place)."""
        each = np.array(counts, dtype=np.int64) // self.world
        step = np.broadcast_to(each, (self.world, len(counts)))
        self._left_in_shard -= k * step
        self._taken += k * step
        self._consumed += k * np.array(counts, dtype=np.int64)
        self._left -= k * self.batch
        return np.broadcast_to(step, (k, *step.shape)).copy()

    def _step(self) -> np.ndarray:
        need = np.minimum(self._left, self.batch)
        rows = int(need.sum())
        counts = apportion(rows, self.weights, self._consumed, self._left_in_shard.sum(axis=0))
        dealt = None
        if (need == self.batch).all():
            dealt = deal(counts, self.batch, self._taken)
        if dealt is None or (dealt > self._left_in_shard).any():
            # the end of a source (or of a rank's rows): each rank fills from its own shards
            dealt = np.stack(
                [
                    apportion(int(need[r]), self.weights, self._taken[r], self._left_in_shard[r])
                    for r in range(self.world)
                ]
            )
        self._update(dealt, need)
        return dealt

    def _update(self, dealt: np.ndarray, need: np.ndarray) -> None:
        self._left_in_shard -= dealt
        self._taken += dealt
        self._consumed += dealt.sum(axis=0)
        self._left -= need


_Takings = tuple[tuple[int, ...], ...]
"""Rows of each source each rank took, less the least any rank took of that source."""


def _relative(taken: list[list[int]]) -> _Takings:
    least = [min(column) for column in zip(*taken)]
    return tuple(tuple(t - m for t, m in zip(row, least)) for row in taken)


def _deal_lists(counts: list[int], world: int, taken: list[list[int]]) -> list[list[int]]:
    """``deal`` on lists, for a step whose counts add up (``_fast_steps``)."""
    base = [c // world for c in counts]
    spare = [c - b * world for c, b in zip(counts, base)]
    per_rank = sum(spare) // world
    step = [list(base) for _ in range(world)]
    if per_rank:
        room = [per_rank] * world
        for s in sorted(range(len(counts)), key=lambda i: (-spare[i], i)):
            if not spare[s]:
                continue
            ranked = sorted(range(world), key=lambda r: (-room[r], taken[r][s], r))
            for r in ranked[: spare[s]]:
                step[r][s] += 1
                room[r] -= 1
    return step
