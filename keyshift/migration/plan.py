"""Step 1 of a switch (issue 9), the plan: the new assignment that moves the least state.

Among the assignments of the target strategy whose balance degree on the monitor's sample
(paper 000 eq. 1: min slot load / max slot load, loads in sampled events) is within `tolerance`
of the best one considered, take the one that moves the fewest state bytes from the assignment
in force. A key's state moves whole; a bucket (key group, `bucket_of(key, B)`, paper 001 §4.3
eq. 11) moves when any of its keys does; a split key (hot_split) moves when its first slot or
its set of slots changes. Keys, buckets and bytes moved are reported.

* Rule strategies (`RULE_STRATEGIES`): a pure function of the key that every producer and
  executor computes itself, so the plan is the rule (one candidate).
* Learned strategies (least_key, least_count: paper 000 §4.2.1 Algorithm 1; our hot_split) are
  a history map, so any map is admissible. Candidates: (a) the strategy built from the sample
  as `keyshift.placement.learning.learn_strategy` builds it, (b) (a) with its slot labels
  permuted to keep the most state in place (`max_weight_matching`), (c) the map in force,
  rebalanced by the fewest moves (`_rebalanced`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

import numpy as np

from keyshift.errors import ConfigurationError, PlacementError
from keyshift.monitoring.balance import balance_degree
from keyshift.placement.learning import LEARNED_STRATEGIES, learn_strategy
from keyshift.placement.strategies import bucket_of, check_partitions, strategy_by_name
from keyshift.processing.job_config import RULE_STRATEGIES

Slots = tuple[int, ...]
_EPS = 1e-12

__all__ = ["RULE_STRATEGIES", "MigrationPlan", "max_weight_matching", "plan_switch"]


@dataclass(frozen=True)
class MigrationPlan:
    """A planned assignment and what it moves. Loads are sampled events; state is in bytes.

    `mapping` holds every planned key's (first) slot, `split` the slots of hot_split's split keys.

    `min_moved_share` = B / `state_bytes_total`, B a lower bound on the state bytes that ANY
    assignment over P2 slots with balance degree >= β = (1 - tolerance) * `best_balance_degree`
    must move (0.0 when there are no bytes). For a rule strategy B is the rule's own bytes moved,
    as no other map may carry its name. For a learned one, with T the sampled events, L_s the
    events slot s holds now and M the max slot load of such an assignment (so every slot ends
    with >= βM events), B = min over M in [M_low, T / (P2 β) (T if β = 0)] of max(out(M), in(M)):
      F(M): the keys that must move whatever else moves: on a slot >= P2; split when the target
        does not split (least_*); or holding more than M events on one slot (x / k for a key of
        x events on k slots). out(M) = bytes of F(M) + Σ_s knap(pieces on s, L_s − M), where
        L_s counts the pieces of the keys not in F(M) and a piece is (x/k events, b/k bytes).
      in(M) = bytes of F(M) + knap(keys not in F(M), Σ_s max(0, βM − L_s) − events of F(M)).
      knap(items, n) = the fewest bytes whose events reach n, fractions allowed (most events
        per byte first). M_low = T / P2, or the largest key's events if the target keeps keys
        whole. A key counted in both out and in is counted once: the moved bytes >= each.
    Whole keys cannot move by fractions, so the best reachable share is usually a little above.
    """

    strategy: str
    partitions: int
    mapping: dict[str, int]
    split: dict[str, tuple[int, ...]]
    balance_degree: float
    best_balance_degree: float
    keys_moved: int
    keys_total: int
    buckets_moved: int
    buckets_total: int
    state_bytes_moved: int
    state_bytes_total: int
    moved_share: float
    min_moved_share: float
    candidate: str
    candidates: tuple[dict, ...]

    def as_record(self) -> dict:
        """Every field, JSON-able; `mapping` is summarised as `keys` (how many keys it maps)."""
        record = {name: value for name, value in asdict(self).items() if name != "mapping"}
        record["keys"] = len(self.mapping)
        record["split"] = {key: list(slots) for key, slots in self.split.items()}
        record["candidates"] = [dict(candidate) for candidate in self.candidates]
        return record


@dataclass(frozen=True)
class _Sample:
    loads: dict[str, int]  # every planned key -> sampled events (0 when not sampled)
    sizes: dict[str, int]  # key -> state bytes
    current: dict[str, Slots]  # key -> its slots in force (some may be >= P2)
    partitions: int  # P2

    def slot_loads(self, placement: Mapping[str, Slots]) -> list[float]:
        """Events per slot, a split key's events spread evenly over its slots."""
        per_slot = [0.0] * self.partitions
        for key, slots in placement.items():
            for slot in slots:
                per_slot[slot] += self.loads[key] / len(slots)
        return per_slot

    def moved(self, placement: Mapping[str, Slots]) -> list[str]:
        """Keys whose first slot or set of slots differs from the ones in force."""
        return [k for k, new in placement.items() if new[0] != self.current[k][0] or set(new) != set(self.current[k])]

    def candidate(self, name: str, placement: dict[str, Slots]) -> dict:
        """A candidate's record: its name, placement, balance degree and state bytes moved."""
        moved = self.moved(placement)
        balance = balance_degree(self.slot_loads(placement))
        return {"name": name, "placement": placement, "balance": balance, "bytes": sum(self.sizes[k] for k in moved)}


def plan_switch(
    loads: Mapping[str, int],
    current: Callable[[str], tuple[int, ...]],
    strategy: str,
    partitions: int,
    *,
    state_bytes: Mapping[str, int] | None = None,
    tolerance: float = 0.02,
    buckets: int = 4096,
) -> MigrationPlan:
    """Plan the switch of the assignment in force to `strategy` over P2 = `partitions` slots.

    Args:
        loads: key -> sampled events (the monitor's sample), ints >= 0.
        current: key -> its slots in force now, distinct ints >= 0 (one for a whole key; an int
            is read as one slot); slots >= P2 are allowed (P shrinks) and must move.
        strategy: hash or modulo (rules), least_key, least_count or hot_split (learned).
        partitions: P2 >= 1.
        state_bytes: key -> state bytes (ints >= 0), e.g. from the state reader. Its keys absent
            from `loads` are planned with 0 events (`current` cannot list the keys in force).
            None: state proportional to the sampled events (1 byte per event).
        tolerance: in [0, 1): admissible = balance degree >= (1 - tolerance) * the best.
        buckets: B >= 1 for `bucket_of` (buckets moved).

    Returns:
        The admissible candidate moving the fewest bytes (then keys, then the better balance).

    Raises:
        ConfigurationError: an unknown strategy, or weight (its table is set by hand, not
            planned); P2 < 1; a bad tolerance, buckets, event count, byte count or slots.
        PlacementError: modulo with a key that is not an integer (`integer_key`).
    """
    sample = _sample(loads, current, strategy, partitions, state_bytes, tolerance, buckets)
    if strategy in RULE_STRATEGIES:
        rule = strategy_by_name(strategy, partitions)
        candidates = [sample.candidate("strategy's rule", {key: (rule.slot_of(key),) for key in sample.loads})]
        least_bytes = float(candidates[0]["bytes"])
    else:
        splitting = strategy == "hot_split"
        built = {
            key: slots if isinstance(slots, tuple) else (slots,)
            for key, slots in learn_strategy(strategy, sample.loads, partitions).assignment.items()
        }
        candidates = [sample.candidate("strategy as built", built)]
        candidates.append(sample.candidate("slots relabelled to match the current", _relabelled(built, sample)))
        goal = (1 - tolerance) * max(c["balance"] for c in candidates)
        window = _least_bytes_moved(sample, goal, splitting)[1]
        candidates.append(sample.candidate("min-move rebalance", _rebalanced(sample, goal, window, splitting)))
        least_bytes = _least_bytes_moved(sample, (1 - tolerance) * max(c["balance"] for c in candidates), splitting)[0]
    best = max(c["balance"] for c in candidates)
    admissible = [c for c in candidates if c["balance"] >= (1 - tolerance) * best - _EPS]
    chosen = min(admissible, key=lambda c: (c["bytes"], len(sample.moved(c["placement"])), -c["balance"]))
    moved = sample.moved(chosen["placement"])
    total = sum(sample.sizes.values())
    share = (lambda nbytes: nbytes / total) if total else (lambda nbytes: 0.0)
    return MigrationPlan(
        strategy=strategy,
        partitions=partitions,
        mapping={key: slots[0] for key, slots in chosen["placement"].items()},
        split={key: slots for key, slots in chosen["placement"].items() if len(slots) > 1},
        balance_degree=chosen["balance"],
        best_balance_degree=best,
        keys_moved=len(moved),
        keys_total=len(sample.loads),
        buckets_moved=len({bucket_of(key, buckets) for key in moved}),
        buckets_total=len({bucket_of(key, buckets) for key in sample.loads}),
        state_bytes_moved=chosen["bytes"],
        state_bytes_total=total,
        moved_share=share(chosen["bytes"]),
        min_moved_share=share(min(least_bytes, chosen["bytes"])),  # min(): float rounding only
        candidate=chosen["name"],
        candidates=tuple(
            {"candidate": c["name"], "balance_degree": c["balance"], "moved_share": share(c["bytes"])} for c in candidates
        ),
    )


def _sample(loads, current, strategy, partitions, state_bytes, tolerance, buckets) -> _Sample:
    """Check the arguments (ConfigurationError naming the bad value); gather the planned keys."""
    if strategy not in RULE_STRATEGIES + LEARNED_STRATEGIES:
        known = ", ".join(RULE_STRATEGIES + LEARNED_STRATEGIES)
        raise ConfigurationError(f"cannot plan a switch to strategy {strategy!r}; plannable: {known}")
    try:
        check_partitions(partitions)
    except PlacementError as exc:
        raise ConfigurationError(f"target {exc}") from None
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        raise ConfigurationError(f"tolerance must be in [0, 1), got {tolerance!r}")
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1:
        raise ConfigurationError(f"buckets must be an int >= 1, got {buckets!r}")
    sizes = dict(loads) if state_bytes is None else dict(state_bytes)
    events = {key: loads.get(key, 0) for key in [*loads, *(key for key in sizes if key not in loads)]}
    for what, table in (("sampled events", events), ("state bytes", sizes)):
        for key, value in table.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigurationError(f"{what} of key {key!r} must be an int >= 0, got {value!r}")
    in_force = {}
    for key in events:
        raw = current(key)
        slots = (raw,) if isinstance(raw, (int, np.integer)) else tuple(raw)
        if not slots or len(set(slots)) != len(slots) or not all(isinstance(s, (int, np.integer)) and s >= 0 for s in slots):
            raise ConfigurationError(f"slots in force of key {key!r} must be distinct ints >= 0, got {raw!r}")
        in_force[key] = tuple(int(slot) for slot in slots)
    return _Sample(events, {key: sizes.get(key, 0) for key in events}, in_force, partitions)


def _relabelled(built: dict[str, Slots], sample: _Sample) -> dict[str, Slots]:
    """Candidate (b): `built` with slot s renamed perm[s], perm maximising the bytes that stay.

    Weight of (s, l): the bytes of the keys built on s whose slot in force is l (a split key
    with as many slots in force: b/k per aligned piece), plus a per-key term below one byte in
    total so that, bytes being equal, more keys stay. Renaming keeps the slot loads' multiset,
    hence the balance. For split keys the weight is a proxy, so the renamed map is kept only
    if it moves no more bytes than `built` itself (the identity).
    """
    size = sample.partitions
    tiny = min([b for b in sample.sizes.values() if b > 0] or [1]) / (len(sample.loads) + 1)
    stay = np.zeros((size, size))
    for key, slots in built.items():
        old = sample.current[key]
        if len(old) == len(slots) and max(old) < size:
            for new_slot, old_slot in zip(slots, old):
                stay[new_slot, old_slot] += (sample.sizes[key] + tiny) / len(slots)
    perm = max_weight_matching(stay)
    renamed = {key: tuple(perm[slot] for slot in slots) for key, slots in built.items()}
    cost = lambda placement: sum(sample.sizes[k] for k in sample.moved(placement))  # noqa: E731
    return renamed if cost(renamed) <= cost(built) else built


def max_weight_matching(weight: np.ndarray) -> list[int]:
    """The permutation perm (row -> column) maximising Σ weight[row, perm[row]] of an n x n matrix.

    Exact: the Hungarian method with potentials (Kuhn-Munkres, O(n^3)) on cost = max - weight.
    """
    weight = np.asarray(weight, dtype=float)
    size = len(weight)
    cost = weight.max(initial=0.0) - weight
    u, v = np.zeros(size + 1), np.zeros(size + 1)
    owner = np.zeros(size + 1, dtype=int)  # owner[j]: the row (from 1) matched to column j; 0: none
    way = np.zeros(size + 1, dtype=int)
    for row in range(1, size + 1):
        owner[0], column = row, 0
        least = np.full(size + 1, math.inf)
        used = np.zeros(size + 1, dtype=bool)
        while owner[column] != 0:
            used[column] = True
            reduced = cost[owner[column] - 1] - u[owner[column]] - v[1:]
            free = ~used[1:]
            better = free & (reduced < least[1:])
            least[1:][better], way[1:][better] = reduced[better], column
            open_columns = np.flatnonzero(free) + 1
            nearest = open_columns[np.argmin(least[open_columns])]
            delta = least[nearest]
            u[owner[used]] += delta
            v[used] -= delta
            least[1:][free] -= delta
            column = nearest
        while column:
            owner[column], column = owner[way[column]], way[column]
    return np.argsort(owner[1:]).tolist()  # row r + 1 owns column perm[r]


def _rebalanced(sample: _Sample, goal: float, top: float, splitting: bool) -> dict[str, Slots]:
    """Candidate (c): the map in force, changed only as much as the balance `goal` needs.

    1. A key keeps its slots in force when they are all < P2 (whole under least_*: its first
       slot), and, under hot_split (`splitting`), its events per slot are <= `top`. The other
       keys, heaviest first, go to the least-loaded slots: whole, unless hot_split must split
       a key above `top` events: over the k slots, k >= its events / top (fewest on a tie),
       that bring the loads closest to the window [goal*top, top].
    2. While the balance degree is below `goal`, one whole key moves to the lightest slot: the
       move that most reduces the loads' distance to that window per byte moved (most events
       per byte), the larger reduction on a tie. When no move reduces it, the heaviest slot
       gives the lightest a key lighter than their gap, most events per byte first; when it
       has none, a move or a swap with a lighter slot (`_unstuck`).
    """
    size, placement, pending = sample.partitions, {}, []
    distance = lambda v: np.maximum(0.0, v - top) + np.maximum(0.0, goal * top - v)  # noqa: E731
    for key in sorted(sample.loads, key=lambda k: -sample.loads[k]):
        old = sample.current[key]
        if max(old) >= size or (splitting and sample.loads[key] / len(old) > top):
            pending.append(key)
        else:
            placement[key] = old if splitting else old[:1]
    load = np.array(sample.slot_loads(placement))
    for key in pending:
        order = sorted(range(size), key=lambda slot: (load[slot], slot))  # `least_loaded`'s order
        spread = lambda k: np.bincount(order[:k], minlength=size) * (sample.loads[key] / k)  # noqa: E731
        fewest = max(1, math.ceil(sample.loads[key] / top)) if splitting and top > 0 else 1
        widths = range(fewest, max(fewest, min(size, sample.loads[key])) + 1) if fewest > 1 else (1,)
        width = min(widths, key=lambda k: distance(load + spread(k)).sum())
        placement[key], load = tuple(order[:width]), load + spread(width)
    whole = [key for key, slots in placement.items() if len(slots) == 1 and sample.loads[key] > 0]
    events = np.array([sample.loads[key] for key in whole], dtype=float)
    nbytes = np.array([sample.sizes[key] for key in whole], dtype=float)
    where = np.array([placement[key][0] for key in whole], dtype=int)
    per_byte = np.divide(events, nbytes, out=np.full(len(whole), np.inf), where=nbytes > 0)
    stuck = False
    for _ in range(len(whole) * size):
        if balance_degree(load.tolist()) >= goal - _EPS:
            break
        light = int(np.argmin(load))
        if not stuck:
            tie = distance(load[where]) + distance(load[light]) - distance(load[where] - events) - distance(load[light] + events)
            tie[(where == light) | (tie <= _EPS)] = 0.0
            score = np.divide(tie, nbytes, out=np.where(tie > 0, np.inf, 0.0), where=nbytes > 0)
            stuck = not tie.any()
        if stuck:
            heavy = int(np.argmax(load))
            fits = (where == heavy) & (events < load[heavy] - load[light])
            if not fits.any():
                step = _unstuck(load, where, events, nbytes)
                if step is None:
                    break
                for pick, slot in step:
                    load[where[pick]] -= events[pick]
                    load[slot] += events[pick]
                    where[pick] = slot
                continue
            score, tie = np.where(fits, per_byte, -1.0), -np.abs(events - (load[heavy] - load[light]) / 2)
        high = score.max()
        near = np.flatnonzero(score >= (high if np.isinf(high) else high * (1 - 1e-9)))
        pick = int(near[np.argmax(tie[near])])
        load[where[pick]] -= events[pick]
        load[light] += events[pick]
        where[pick] = light
    placement.update((key, (int(slot),)) for key, slot in zip(whole, where))
    return placement


def _unstuck(load: np.ndarray, where: np.ndarray, events: np.ndarray, nbytes: np.ndarray) -> list[tuple[int, int]] | None:
    """`_rebalanced`'s step when no key of the heaviest slot h fits the gap to the lightest.

    For each slot s ≠ h, lightest first, the first that admits one: a key of h with fewer
    events than load[h] - load[s] moves to s, or a key a of h and a key b of s swap, with
    0 < events(a) - events(b) < load[h] - load[s]. Either lowers h without raising s to h's
    load, so the sum of squared slot loads falls strictly and the loop ends (the rule of a
    pairwise-exchange local search for multiway number partitioning). Among a slot's choices:
    the largest narrowing of the pair's gap per byte moved, then the largest narrowing.

    Args:
        load: events per slot (float array of length P2), where: each whole key's slot, events
            and nbytes: each whole key's events and state bytes (arrays of one length).

    Returns:
        [(key index, new slot), ...] (one move or the two halves of a swap), or None when no
        slot admits one.
    """
    heavy = int(np.argmax(load))
    mine = np.flatnonzero(where == heavy)
    for slot in np.argsort(load, kind="stable"):
        gap = load[heavy] - load[slot]
        if slot == heavy or gap <= _EPS:
            continue
        theirs = np.flatnonzero(where == slot)
        given = np.concatenate([events[mine][:, None] - events[theirs][None, :], events[mine][:, None]], axis=1)
        cost = np.concatenate([nbytes[mine][:, None] + nbytes[theirs][None, :], nbytes[mine][:, None]], axis=1)
        fits = (given > _EPS) & (given < gap - _EPS)
        if not fits.any():
            continue
        narrowing = np.where(fits, gap - np.abs(gap - 2 * given), -1.0)
        score = np.where(fits, np.divide(narrowing, cost, out=np.full(cost.shape, np.inf), where=cost > 0), -np.inf)
        high = score.max()
        near = score >= (high if np.isinf(high) else high * (1 - 1e-9))
        row, column = np.unravel_index(np.argmax(np.where(near, narrowing, -np.inf)), score.shape)
        step = [(int(mine[row]), int(slot))]
        if column < len(theirs):
            step.append((int(theirs[column]), heavy))
        return step
    return None


def _knap(events: np.ndarray, nbytes: np.ndarray, group: np.ndarray, need: np.ndarray) -> float:
    """Σ over groups g of the fewest bytes whose events reach need[g], fractions allowed.

    Items are sorted by group, then by events per byte (most first): the fractional knapsack
    takes each item whole while its group's need is not met, and the last one in part.
    """
    before = np.cumsum(events) - events
    totals = np.bincount(group, events, minlength=len(need))
    before -= np.concatenate([[0.0], np.cumsum(totals)[:-1]])[group]  # events before it in its group
    take = np.clip(np.divide(need[group] - before, events, out=np.zeros(len(events)), where=events > 0), 0.0, 1.0)
    return float((take * nbytes).sum())


def _least_bytes_moved(sample: _Sample, beta: float, splitting: bool) -> tuple[float, float]:
    """(B, M): `MigrationPlan`'s lower bound B at balance `beta`, and a max slot load M reaching it."""
    size, total = sample.partitions, float(sum(sample.loads.values()))
    per_byte = lambda k: sample.loads[k] / sample.sizes[k] if sample.sizes[k] else math.inf  # noqa: E731
    keys = sorted(sample.loads, key=lambda k: -per_byte(k))  # most events per byte first
    events = np.array([sample.loads[k] for k in keys], dtype=float)
    nbytes = np.array([sample.sizes[k] for k in keys], dtype=float)
    width = np.array([len(sample.current[k]) for k in keys])
    forced = np.array([max(sample.current[k]) >= size or (len(sample.current[k]) > 1 and not splitting) for k in keys], bool)
    piece = events / width
    owner = np.array([i for i, k in enumerate(keys) if not forced[i] for _ in sample.current[k]], dtype=int)
    slot = np.array([s for i, k in enumerate(keys) if not forced[i] for s in sample.current[k]], dtype=int)
    order = np.argsort(slot, kind="stable")  # by slot, then most events per byte
    owner, slot = owner[order], slot[order]

    def sides(top: float) -> tuple[float, float]:
        """(out(top), in(top)) of `MigrationPlan`'s docstring."""
        stays = ~forced & (piece <= top)
        fixed = nbytes[~stays].sum()
        held = np.bincount(slot, np.where(stays[owner], piece[owner], 0.0), minlength=size)
        pieces = np.where(stays[owner], piece[owner], 0.0), (nbytes / width)[owner]
        out = _knap(*pieces, slot, np.maximum(0.0, held - top))
        missing = np.maximum(0.0, beta * top - held).sum() - events[~stays].sum()
        into = _knap(np.where(stays, events, 0.0), nbytes, np.zeros(len(keys), dtype=int), np.array([missing]))
        return fixed + out, fixed + into

    low = max([total / size] + ([] if splitting else [max(sample.loads.values(), default=0)]))
    high = max(low, total / (size * beta) if beta > 0 else total)
    # F(M) changes at each piece value; between two, out falls and in rises with M: bisect each.
    edges = sorted({low, high, *(float(p) for p in piece[~forced] if low < p < high)})
    found = []
    for start, end in zip(edges, edges[1:]):
        end *= 1 if end == high else 1 - 1e-12
        for _ in range(60):
            middle = (start + end) / 2
            out, into = sides(middle)
            start, end = (middle, end) if out > into else (start, middle)
        found += [(max(sides(start)), start), (max(sides(end)), end)]
    return min(found + [(max(sides(edge)), edge) for edge in edges])
