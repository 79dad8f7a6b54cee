"""When to rescale: the job's flow network, capacities learned by feedback, the bottleneck, a parallelism (paper 001).

Paper 001 (FAR-Flink) models a topology as a flow network (§3.1, Definition 1): edge (v_i, v_j)
has a capacity c (tuples/s the head node v_j can take) and a flow f (tuples/s it takes now).
Augmenting paths (Definitions 2-3, eq. 2-4) raise f to the maximum flow; a partition D = (X, Y)
with f(X, Y) >= λ c(X, Y), 0.85 <= λ <= 1 (eq. 5, 6, 10) names the operator heading Y as a
bottleneck whose parallelism should grow (Algorithm 2). Capacities come from latency (eq. 13,
14) and are corrected by a feedback step of size η (eq. 15-17, Algorithm 1).

A keyshift job is the chain source → parse → stateful → sink. What each quantity is here:

| paper | here (a Spark micro-batch job, one record of `runs/<run_id>/progress.jsonl` per batch) |
| --- | --- |
| source s | the Kafka topic |
| node parse | Spark's source stage: its tasks (one per Kafka partition, or S each reading a range of them) read, parse, validate, pre-aggregate |
| node stateful | the stateful stage: S tasks, one per stateful partition (each holding P/S slots) |
| sink t | the rest of a batch: planning, commits and driver-side sink work (batch time − the two stages) |
| f, eq. 1 | events/s through the job over the wall clock: Σ input_rows / (last end − first start) |
| l_{v_j}, eq. 13 | ms per event the stage needs: 1000 × Σ wall_j / Σ input_rows over the timed batches |
| wall_j of a batch | max(slowest task, Σ task seconds / cores): P tasks on `cores` cores |
| c, eq. 14 | 1000 / l: events/s the stage passes while it runs |
| θ of Algorithm 1 | per edge, the latency its capacity in force allows, 1000 / c (eq. 14 read backwards) |
| "f ≈ c" of Algorithm 1 | the job was saturated: batches back to back, Σ batch time >= λ × span |
| "too much accumulation" | the consumer lag keeps growing (`lag_trend`) |

Stages of a micro-batch run one after the other, so f / c_j is the share of the wall clock stage j
is busy and the shares add up: the job keeps up with an arrival rate a only if Σ_j a / c_j <= 1
(Spark's own processedRowsPerSecond >= inputRowsPerSecond). Flink's stages run at once, where
c_j >= a suffices. `recommend_parallelism` sizes P on the sum, with the paper's λ as headroom.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import combinations
from typing import Any

from keyshift.errors import ConfigurationError

Edge = tuple[str, str]
JOB_EDGES: tuple[Edge, ...] = (("source", "parse"), ("parse", "stateful"), ("stateful", "sink"))
"""The flight and Yahoo jobs' flow network; an edge's capacity is its head stage's (eq. 14)."""
SCALED = ("parse", "stateful")
"""Stages whose capacity the model scales with P (the sink's it does not). Their tasks are S =
min(P, the run's cap; by default 1 per core, `keyshift.placement.tokens.STATEFUL_PARTITIONS_PER_CORE`),
so past the engine's cores a larger P gives finer placement, not more parallel tasks: the model
assumes, as paper 001 does, that parallelism brings its own resources."""
LAMBDA = 0.85
"""The paper's λ (eq. 10): a partition whose flow reaches 85 % of its capacity is a bottleneck."""
MAX_BATCHES = 200
"""At most this many of the newest batches make one evaluation's window (the first one of a long run)."""
_EPS = 1e-9


def _residual(capacity: Mapping[Edge, float], flow: Mapping[Edge, float], u: str, v: str) -> float:
    """c_f(u, v) of eq. 2: room left on (u, v) plus the flow on (v, u) that can be sent back."""
    return capacity.get((u, v), 0.0) - flow.get((u, v), 0.0) + flow.get((v, u), 0.0)


def max_flow(capacity: Mapping[Edge, float], source: str, sinks: str | Iterable[str],
             initial: Mapping[Edge, float] | None = None) -> tuple[float, dict[Edge, float]]:
    """Maximum flow by augmenting paths found breadth first (Edmonds-Karp; Algorithm 2, steps 1-10).

    Args:
        capacity: c(u, v) >= 0 per directed edge, events/s. source: s. sinks: t, or every t_i.
        initial: a feasible flow to start from (Algorithm 2 starts from the measured f); default 0.

    Returns:
        (|f| of eq. 1, f per edge): residuals by eq. 2, a path's increment by eq. 3, the update
        by eq. 4 (flow on a reverse edge is cancelled first).

    Raises:
        ConfigurationError: a negative or infinite capacity, s among the sinks, an initial flow
            outside [0, c] or not conserved at an inner node.
    """
    targets = {sinks} if isinstance(sinks, str) else set(sinks)
    flow = {e: float((initial or {}).get(e, 0.0)) for e in capacity}
    nodes = {u for e in capacity for u in e}
    if not targets or source in targets:
        raise ConfigurationError(f"the sinks {sorted(targets)} must be given and exclude the source {source!r}")
    if bad := {e: (c, flow[e]) for e, c in capacity.items() if not (0 <= c < math.inf and -_EPS <= flow[e] <= c + _EPS)}:
        raise ConfigurationError(f"each edge needs a finite capacity >= 0 events/s and 0 <= f <= c; got (c, f) {bad}")
    for node in nodes - targets - {source}:
        if abs(sum(f for (u, v), f in flow.items() if v == node) - sum(f for (u, v), f in flow.items() if u == node)) > 1e-6:
            raise ConfigurationError(f"the initial flow is not conserved at {node!r}")
    near = {n: sorted({v for u, v in capacity if u == n} | {u for u, v in capacity if v == n}) for n in nodes}
    while True:
        parent: dict[str, str] = {source: source}
        queue, reached = deque([source]), None
        while queue and reached is None:
            u = queue.popleft()
            for v in near[u]:
                if v not in parent and _residual(capacity, flow, u, v) > _EPS:
                    parent[v] = u
                    reached = v if v in targets else None
                    if reached:
                        break
                    queue.append(v)
        if reached is None:
            break
        path, v = [], reached
        while v != source:
            path.append((parent[v], v))
            v = parent[v]
        step = min(_residual(capacity, flow, u, v) for u, v in path)  # eq. 3
        for u, v in path:  # eq. 4
            back = min(flow.get((v, u), 0.0), step)
            if back:
                flow[(v, u)] -= back
            if step > back:
                flow[(u, v)] += step - back
    return sum(f for (u, _), f in flow.items() if u == source) - sum(f for (_, v), f in flow.items() if v == source), flow


def min_cut(capacity: Mapping[Edge, float], flow: Mapping[Edge, float], source: str) -> tuple[frozenset[str], frozenset[str]]:
    """The minimum partition (X, Y) of a maximum flow (§3.2): X = nodes reachable from s in the residual network."""
    nodes = {u for e in capacity for u in e}
    reach, queue = {source}, deque([source])
    while queue:
        u = queue.popleft()
        for v in sorted(nodes - reach):
            if _residual(capacity, flow, u, v) > _EPS:
                reach.add(v)
                queue.append(v)
    return frozenset(reach), frozenset(nodes - reach)


def cut_capacity(capacity: Mapping[Edge, float], x: frozenset[str]) -> float:
    """c(X, Y) of eq. 5: Σ c over the edges from X to Y, events/s."""
    return sum(c for (u, v), c in capacity.items() if u in x and v not in x)


def cut_flow(flow: Mapping[Edge, float], x: frozenset[str]) -> float:
    """f(X, Y) of eq. 6: flow from X to Y minus flow from Y to X, events/s."""
    return sum(f for (u, v), f in flow.items() if u in x and v not in x) - sum(f for (u, v), f in flow.items() if v in x and u not in x)


def bottlenecks(capacity: Mapping[Edge, float], flow: Mapping[Edge, float], source: str, sinks: Iterable[str], lam: float = LAMBDA) -> set[str]:
    """Operators to scale (Algorithm 2, steps 11-16): the heads in Y of every partition with f(X, Y) >= λ c(X, Y) (eq. 10).

    Every partition with s in X and the sinks in Y is tried (at most 16 inner nodes). Raises
    ConfigurationError when λ is outside the paper's [0.85, 1] or the graph is larger.
    """
    if not LAMBDA <= lam <= 1:
        raise ConfigurationError(f"λ must lie in [0.85, 1] (paper 001 eq. 10), got {lam!r}")
    ends = set(sinks)
    inner = sorted({u for e in capacity for u in e} - ends - {source})
    if len(inner) > 16:
        raise ConfigurationError(f"{len(inner)} inner nodes: too many partitions to enumerate (at most 16)")
    found: set[str] = set()
    for size in range(len(inner) + 1):
        for chosen in combinations(inner, size):
            x = frozenset({source, *chosen})
            c = cut_capacity(capacity, x)
            if c > 0 and cut_flow(flow, x) >= lam * c - _EPS:
                found |= {v for (u, v) in capacity if u in x and v not in x}
    return found


def stage_wall_seconds(slot_seconds: Sequence[float], cores: int) -> float:
    """A stage's wall time, s: P tasks of `slot_seconds` on `cores` cores last at least the slowest task and Σ / cores."""
    return max(max(slot_seconds, default=0.0), sum(slot_seconds) / cores)


@dataclass(frozen=True)
class Window:
    """What the new batches measured: their count, input rows, newest batch id and its P; flow
    (events/s, eq. 1); busy_share (Σ batch time / span); latency_ms (eq. 13 per stage, ms per
    event; empty when no batch had task times); timed (batches that had them)."""

    batches: int
    rows: int
    last_batch_id: int
    partitions: int
    flow: float
    busy_share: float
    latency_ms: dict[str, float]
    timed: int


def measure(progress: Sequence[Mapping[str, Any]], task_seconds: Mapping[str, Mapping[str, Sequence[float]]] | None, cores: int,
            after: int = -1, partitions: int | None = None) -> Window | None:
    """Flow and per-stage latency (eq. 13) of the progress records (`RunRecorder.progress` shape) after batch `after`.

    Only batches at `partitions` slots count (default: any). A batch's stage times come from its
    own `stage_seconds` ({"source": [s per slot], "stateful": [...]}) when the driver writes it,
    else from `task_seconds` (`runs/<run_id>/task_seconds.json`, keyed by batch id). A query's
    first batch (batch 0, or a new epoch or P: Python workers and state stores start) and empty
    batches are not timed. None when no batch is left.
    """
    ordered = sorted(progress, key=lambda r: r["batch_id"])
    warm = {r["batch_id"] for prev, r in zip([None, *ordered], ordered) if prev is None or r["batch_id"] == 0
            or (prev.get("epoch"), len(prev.get("processed_rows_per_slot") or [])) != (r.get("epoch"), len(r.get("processed_rows_per_slot") or []))}
    rows = [r for r in ordered if r["batch_id"] > after and r.get("timestamp_ms") is not None and r.get("batch_duration_ms") is not None
            and partitions in (None, len(r.get("processed_rows_per_slot") or []))][-MAX_BATCHES:]
    if not rows:
        return None
    span_s = max(max(r["timestamp_ms"] + r["batch_duration_ms"] for r in rows) - min(r["timestamp_ms"] for r in rows), 1) / 1000
    busy_s = sum(r["batch_duration_ms"] for r in rows) / 1000
    walls, events, timed = {"parse": 0.0, "stateful": 0.0, "sink": 0.0}, 0, 0
    for r in rows:
        times = r.get("stage_seconds") or {k: (task_seconds or {}).get(k, {}).get(str(r["batch_id"])) for k in ("source", "stateful")}
        if r["batch_id"] not in warm and r["input_rows"] and times.get("source") and times.get("stateful"):
            parse, stateful = stage_wall_seconds(times["source"], cores), stage_wall_seconds(times["stateful"], cores)
            for stage, wall in (("parse", parse), ("stateful", stateful), ("sink", max(r["batch_duration_ms"] / 1000 - parse - stateful, 0.001))):
                walls[stage] += wall
            events, timed = events + r["input_rows"], timed + 1
    total = sum(r["input_rows"] for r in rows)
    return Window(len(rows), total, rows[-1]["batch_id"], len(rows[-1].get("processed_rows_per_slot") or []), total / span_s,
                  min(busy_s / span_s, 1.0), {s: 1000 * w / events for s, w in walls.items()} if events else {}, timed)


def feedback_step(edge: Mapping[str, Any] | None, latency_ms: float, flow: float, saturated: bool) -> dict[str, Any]:
    """One feedback correction of an edge's capacity (Algorithm 1, steps 4-12; eq. 14-17).

    `edge` is the edge's state `{"capacity": events/s, ...}`, None/empty before the first
    measurement (then c = 1000 / l', eq. 14, stands in for the paper's eq. 8-9 start); `latency_ms`
    is l' of eq. 13 (ms per event, > 0, else ConfigurationError); `flow` is f (events/s);
    `saturated` is Algorithm 1's "f ≈ c" (module docstring). With l = 1000 / c, the latency the
    capacity in force allows (Algorithm 1's θ): reg = |1000/l − 1000/l'| (eq. 16), |c'| = 1000/l²
    (eq. 15), η = min(reg, |c'|) (eq. 17); c drops by η when l' > l and f <= c (steps 6-7), rises
    by η when l' < l and the job is saturated (steps 8-9), else stays. Returns the new state
    `{"capacity", "latency_ms", "eta"}`. Above c = 1,000 events/s, |c'| = c²/1000 > c > reg of any
    decrease, so c drops to the measured capacity in one step; a rise is at most c²/1000 per step.
    """
    if not latency_ms > 0:
        raise ConfigurationError(f"latency must be > 0 ms per event, got {latency_ms!r}")
    measured = 1000 / latency_ms  # eq. 14
    if not edge or not edge.get("capacity"):
        return {"capacity": measured, "latency_ms": latency_ms, "eta": None}
    c = float(edge["capacity"])
    allowed = 1000 / c
    eta = min(abs(c - measured), 1000 / allowed**2)  # eq. 16, 15, 17
    if latency_ms > allowed and flow <= c:
        c -= eta
    elif latency_ms < allowed and saturated:
        c += eta
    return {"capacity": c, "latency_ms": latency_ms, "eta": eta}


def lag_trend(history: Sequence[tuple[float, float]], k: int = 3) -> tuple[float | None, bool]:
    """(Least-squares slope in records/s of the last k (epoch s, lag in records) observations, None
    with fewer; whether the lag keeps growing: a positive slope and each of the k − 1 steps rising).

    A micro-batch job's committed offsets jump a batch at a time, so its lag saw-tooths; k rises in
    a row filter that. Raises ConfigurationError when k < 3.
    """
    if k < 3:
        raise ConfigurationError(f"k must be >= 3 lag observations, got {k!r}")
    points = sorted(history)[-k:]
    if len(points) < k:
        return None, False
    t_mean, y_mean = sum(t for t, _ in points) / k, sum(y for _, y in points) / k
    spread = sum((t - t_mean) ** 2 for t, _ in points)
    if spread <= 0:
        return None, False
    slope = sum((t - t_mean) * (y - y_mean) for t, y in points) / spread
    return slope, slope > 0 and all(b[1] > a[1] for a, b in zip(points, points[1:]))


@dataclass(frozen=True)
class Recommendation:
    """A parallelism for the stateful stage, and why.

    Attributes:
        bottleneck: the stage heading the minimum partition, or None without capacities.
        current: P in force. recommended: P to switch to (= current: stay), None without enough data.
        why: one sentence. lag_trend: records/s (None: fewer than k observations).
        capacities: events/s per stage (the edge into it). utilisation: f / c per stage.
        max_flow: events/s (the paper's model). flow: measured events/s.
        state: the feedback state to keep for the next evaluation (plain JSON).
    """

    bottleneck: str | None
    current: int
    recommended: int | None
    why: str
    lag_trend: float | None
    capacities: dict[str, float]
    max_flow: float | None
    flow: float | None
    utilisation: dict[str, float]
    state: dict[str, Any] = field(repr=False)

    def as_record(self) -> dict[str, Any]:
        """JSON-able fields without `state`, rounded for a record."""
        out = {k: v for k, v in asdict(self).items() if k != "state"}
        out["capacities"] = {s: round(c, 1) for s, c in self.capacities.items()}
        out["utilisation"] = {s: round(u, 3) for s, u in self.utilisation.items()}
        return out


def recommend_parallelism(progress: Sequence[Mapping[str, Any]], lag_history: Sequence[tuple[float, float]], state: Mapping[str, Any] | None,
                          *, cores: int, slots_per_core: float, task_seconds: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
                          partitions: int | None = None, lam: float = LAMBDA, k: int = 3, low_utilisation: float = 0.3,
                          target_utilisation: float = 0.5) -> Recommendation:
    """Learn the capacities from the new batches, find the bottleneck, size P (paper 001 Algorithms 1-2).

    Args:
        progress: the run's progress records (those after `state["last_batch_id"]` are new).
        lag_history: (epoch s, total consumer lag in records) of the monitor's evaluations.
        state: the previous call's `Recommendation.state`, or None; reset when the run or P changes.
        cores: cores the job runs on. slots_per_core: P never exceeds floor(cores × this).
        task_seconds: `task_seconds.json`, if written. partitions: P in force (default: the records').
        lam: λ of eq. 10, in [0.85, 1]. k: lag observations and low evaluations needed, >= 3.
        low_utilisation, target_utilisation: the shrink rule's f / c shares.

    More slots when the lag keeps growing (`lag_trend`) and eq. 10 on the maximum flow names the
    stateful stage: the smallest P' > P whose busy share a × (P/P' × (1/c_parse + 1/c_stateful) +
    1/c_sink) stays <= λ at the arrival rate a = f + lag slope (parse and stateful follow P; as in
    the paper, an added slot brings its own capacity). Fewer slots when the lag does not grow and
    the stateful stage's f / c stayed below `low_utilisation` for k evaluations in a row: the
    smallest P' whose busy share stays <= `target_utilisation` (below λ, so it does not flap back).

    Raises:
        ConfigurationError: cores < 1, slots_per_core <= 0, λ outside [0.85, 1], k < 3, or not
            0 < low_utilisation < target_utilisation < λ.
    """
    if cores < 1 or not slots_per_core > 0 or not 0 < low_utilisation < target_utilisation < lam or not LAMBDA <= lam <= 1:
        raise ConfigurationError(f"need cores >= 1, slots_per_core > 0, 0 < low < target < λ and 0.85 <= λ <= 1; got {cores}, "
                                 f"{slots_per_core}, {low_utilisation}, {target_utilisation}, {lam}")
    slope, growing = lag_trend(lag_history, k)
    run = progress[-1].get("run_id") if progress else None
    p = partitions or (len(progress[-1].get("processed_rows_per_slot") or []) if progress else 0)
    old = dict(state or {}) if (state or {}).get("run_id") == run and (state or {}).get("partitions") == p else {}
    window = measure(progress, task_seconds, cores, old.get("last_batch_id", -1), p)
    edges = dict(old.get("edges") or {})
    for stage, latency in (window.latency_ms if window else {}).items():
        edges[stage] = feedback_step(edges.get(stage), latency, window.flow, window.busy_share >= lam)
    caps = {s: float(e["capacity"]) for s, e in edges.items()}
    kept = {"run_id": run, "partitions": p, "last_batch_id": window.last_batch_id if window else old.get("last_batch_id", -1),
            "edges": edges, "low_streak": int(old.get("low_streak", 0))}

    def answer(why: str, recommended: int | None = p, bottleneck: str | None = None, top: float | None = None) -> Recommendation:
        flow = window.flow if window else None
        return Recommendation(bottleneck, p, recommended, why, slope, caps, top, flow, {s: flow / c for s, c in caps.items()} if window else {}, kept)

    if window is None:
        return answer("no batch completed since the previous evaluation", None)
    if set(caps) != {"parse", "stateful", "sink"}:
        return answer("no per-stage task times yet (progress stage_seconds or task_seconds.json): the bottleneck cannot be located", None)
    capacity = {e: caps[e[1]] for e in JOB_EDGES}
    top, flows = max_flow(capacity, "source", "sink", dict.fromkeys(JOB_EDGES, min(window.flow, *capacity.values())))
    x, _ = min_cut(capacity, flows, "source")
    neck = next(v for u, v in JOB_EDGES if u in x and v not in x)
    busy = window.flow / caps["stateful"]
    kept["low_streak"] = kept["low_streak"] + 1 if (slope is None or slope <= 0) and busy < low_utilisation else 0
    if slope is None:
        return answer(f"{len(lag_history)} of the {k} lag observations needed", None, neck, top)
    a = window.flow + max(slope, 0.0)
    scaled, fixed, cap = a * sum(1 / caps[s] for s in SCALED), a / caps["sink"], max(1, math.floor(cores * slots_per_core))
    grows = f"the lag grows {slope:.1f} records/s"
    if growing:
        heads = bottlenecks(capacity, flows, "source", ["sink"], lam)
        want = max(p + 1, math.ceil(p * scaled / (lam - fixed))) if fixed < lam else None
        if "stateful" not in heads:
            return answer(f"{grows} but eq. 10 names {sorted(heads)}, not the stateful stage", p, neck, top)
        if want is None:
            return answer(f"{grows} and the unscaled rest of a batch alone takes {fixed:.0%} of the time: more slots cannot catch up", p, neck, top)
        if cap <= p:
            return answer(f"{grows} with the stateful stage a bottleneck, but P = {p} already reaches {cores} cores × {slots_per_core:g}", p, neck, top)
        return answer(f"{grows} and the stateful stage is a bottleneck (eq. 10, λ = {lam:g}): P {p} → {min(want, cap)} keeps the busy share at "
                      f"{a:,.0f} events/s <= {lam:.0%}" + (f" (capped at {cores} cores × {slots_per_core:g})" if want > cap else ""), min(want, cap), neck, top)
    want = min(max(1, math.ceil(p * scaled / (target_utilisation - fixed))), cap) if fixed < target_utilisation else p
    if kept["low_streak"] >= k and want < p:
        return answer(f"the stateful stage stayed below {low_utilisation:.0%} busy for {kept['low_streak']} evaluations with the lag not "
                      f"growing: P {p} → {want} keeps the busy share <= {target_utilisation:.0%}", want, neck, top)
    return answer(f"stay: the lag trend is {slope:+.1f} records/s and the stateful stage is {busy:.0%} busy", p, neck, top)
