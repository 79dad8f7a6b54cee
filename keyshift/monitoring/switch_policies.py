"""Switch policies: when to move to another placement strategy (paper 000 §4.2.2, Table 6 calls them triggers; ours).

Every trigger has one interface, `observe(evaluation, now_s, events) -> Decision`, called after
each evaluation of a sample (`keyshift.monitoring.evaluate.Evaluation`):

* `now_s`: the time of the evaluation, in seconds on any monotonic clock (the same clock for
  every call to one trigger).
* `events`: events the stream carried since the previous call (events, >= 0).

Paper 000 Table 6 (定期 / 定量 / 阈值):

| trigger | fires when | then | paper's use |
| --- | --- | --- | --- |
| `periodic` | T seconds passed since it last fired | move to the best balance degree | steady source rate |
| `count` | N events arrived since it last fired | move to the best balance degree | changing source rate |
| `threshold` | balance degree (eq. 1) in force < θ | move to the best balance degree | as few switches as possible |

Ours, `cost_aware` (DESIGN.md, "Switch only when it pays"): move to the strategy with the
lowest max/mean only when the makespan it saves over a horizon of H seconds exceeds the cost of
a migration, with hysteresis (see `CostAwarePolicy`).

The **expected gain** every decision carries is that makespan saved, in seconds: a saturated
job spends `horizon_s` on the work the horizon brings; a batch lasts as long as its busiest
slot, so the same events under a candidate take `horizon_s * mm_new / mm_cur` (mm = max/mean of
the sampled loads; same events, so max ratio = max/mean ratio), a gain of
`horizon_s * (1 - mm_new / mm_cur)` (negative when the candidate is worse).

A trigger that fires recommends the best strategy; `Decision.switch` is True only when that
strategy differs from the one in force. Triggers keep state between calls (last firing, last
switch); `record_switch` tells them a switch happened (they do not assume their advice is taken).

**Defaults of the scheduled monitor** (`keyshift.orchestration.monitor`; pure rules here, each
value returned with where it came from, which cost_aware names in every reason):

* horizon (`horizon_default`): `horizon_s` when set, else the monitor's evaluation interval (the
  `keyshift_balance_monitor` schedule, 600 s): a decision stands until the next evaluation, so
  the gain it can bring is counted over that period;
* cost (`migration_cost`): the topic's last measured switch (its pause: the old query's last
  commit to the new query's first commit, which includes moving the state); else `cost_s` when set; else the median
  pause of the `RECENT_SWITCHES` newest measured switches of any run and topic; else
  `DEFAULT_COST_S`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from keyshift.errors import ConfigurationError
from keyshift.monitoring.evaluate import Evaluation, StrategyEvaluation

DEFAULT_HORIZON_S = 60.0
"""Horizon H (seconds) of a trigger built without one (e.g. offline `keyshift balance evaluate`);
the scheduled monitor counts over its evaluation interval instead (`horizon_default`)."""

DEFAULT_COST_S = 10.0
"""Migration cost (seconds) assumed when no switch has been measured anywhere (`migration_cost`).

Measured pauses (then from the stop request to the new query's first commit, in the driver): 3.7-11.4 s,
median 4.4 s, in the switch bench of 2026-11-25 (`docs/bench/switch.json`); 12.3-14.3 s in the
switch integration test on a quiet machine and 16.0-39.6 s (median 29.6 s) in the switch bench
on a loaded one (README, Benchmarks, `keyshift bench switch`); 8-20 s reported in issue 33.
10 s lies within those ranges and errs towards switching less than the old 5 s did."""

RECENT_SWITCHES = 20
"""How many measured switches (the newest, of any run and topic) the cost default's median takes (`migration_cost`)."""


@dataclass(frozen=True)
class SourcedSeconds:
    """A number of seconds a trigger uses, with where it came from (shown in the decision's reason).

    Attributes:
        seconds: the value, seconds (>= 0).
        source: what it is, as the reason shows it after "= " (e.g. "the monitor's 10-min schedule",
            "median pause of 5 measured switches (the newest of any run and topic)").
    """

    seconds: float
    source: str


@dataclass(frozen=True)
class MeasuredSwitch:
    """One switch whose pause was measured (`keyshift.migration.switch` records, `pause_seconds`).

    Attributes:
        pause_s: the pause, seconds: from the old query's last commit (its barrier batch's, or the
            stop request without one) to the new query's first commit (includes the state's migration); the switch's cost as the cost_aware trigger counts it.
        switch_id: the switch's id (`sw-<time>-<hex>`), None when unknown.
        topic: the input topic of the switched run, None when unknown.
        finished_at_s: when it finished, epoch seconds; None when unknown (counts as the oldest).
    """

    pause_s: float
    switch_id: str | None = None
    topic: str | None = None
    finished_at_s: float | None = None


def schedule_text(interval_s: float) -> str:
    """A period in seconds as a schedule's name: 600 -> "10-min", 3600 -> "1-h", 90 -> "90-s"."""
    if interval_s >= 3600 and interval_s % 3600 == 0:
        return f"{interval_s / 3600:g}-h"
    if interval_s >= 60 and interval_s % 60 == 0:
        return f"{interval_s / 60:g}-min"
    return f"{interval_s:g}-s"


def horizon_default(given_s: float | None, interval_s: float) -> SourcedSeconds:
    """The horizon H of the monitor's switch policies, seconds: `given_s` when set, else `interval_s`.

    The monitor decides once per evaluation and its decision stands until the next one, so the
    makespan a switch can save before the next decision is counted over the evaluation interval
    (the `keyshift_balance_monitor` schedule's period), not over a fixed minute.

    Args:
        given_s: `horizon_s` as the user set it (seconds, > 0), or None.
        interval_s: the monitor's evaluation interval, seconds (> 0).

    Raises:
        ConfigurationError: the chosen horizon is not > 0.
    """
    if given_s is not None:
        chosen = SourcedSeconds(float(given_s), "horizon_s as set")
    else:
        chosen = SourcedSeconds(float(interval_s), f"the monitor's {schedule_text(interval_s)} schedule")
    if not chosen.seconds > 0:
        raise ConfigurationError(f"horizon_s must be > 0 seconds, got {chosen.seconds!r} ({chosen.source})")
    return chosen


def migration_cost(
    given_s: float | None,
    topic_last: MeasuredSwitch | None,
    recent: Sequence[MeasuredSwitch],
    fallback_s: float = DEFAULT_COST_S,
) -> SourcedSeconds:
    """The migration cost the cost_aware trigger counts, seconds, and where it came from.

    The first that applies:

    1. `topic_last`: the pause of the topic's last measured switch (the cost of this job's state);
    2. `given_s`: the cost the user set (`cost_s`: the cost until the topic has a measured switch);
    3. the median pause of the `RECENT_SWITCHES` newest of `recent` (by `finished_at_s`; switches
       of any run and topic): the median, so one switch slowed down by a loaded machine or a cold
       first batch does not set the cost;
    4. `fallback_s` (`DEFAULT_COST_S`: see there for the measured pauses it stands for).

    Raises:
        ConfigurationError: a negative `given_s` or `fallback_s`.
    """
    if topic_last is not None:
        which = f"the topic's last measured switch {topic_last.switch_id}" if topic_last.switch_id else "the topic's last measured switch"
        return SourcedSeconds(float(topic_last.pause_s), f"{which} (its pause)")
    if given_s is not None:
        if not given_s >= 0:
            raise ConfigurationError(f"cost_s must be >= 0 seconds, got {given_s!r}")
        return SourcedSeconds(float(given_s), "cost_s as set, no switch measured on the topic")
    newest = sorted(recent, key=lambda s: -s.finished_at_s if s.finished_at_s is not None else float("inf"))[:RECENT_SWITCHES]
    if newest:
        if len(newest) == 1:
            only = newest[0]
            named = " ".join(x for x in (only.switch_id, f"on {only.topic}" if only.topic else None) if x)
            return SourcedSeconds(float(only.pause_s), f"pause of the one measured switch{' ' + named if named else ''}, none on the topic")
        return SourcedSeconds(
            float(statistics.median(s.pause_s for s in newest)),
            f"median pause of {len(newest)} measured switches (the newest of any run and topic), none on the topic",
        )
    if not fallback_s >= 0:
        raise ConfigurationError(f"fallback_s must be >= 0 seconds, got {fallback_s!r}")
    return SourcedSeconds(float(fallback_s), "the default, no switch measured")


@dataclass(frozen=True)
class Decision:
    """What a trigger recommends after one evaluation.

    Attributes:
        switch: True to move to `strategy` now.
        strategy: the strategy to place records with from now (the one in force when not switching).
        reason: one sentence saying why, with the figures.
        expected_gain_s: makespan saved over the trigger's horizon by `strategy` versus the one in
            force, in seconds (0.0 when staying; may be negative for a worse candidate).
        trigger: the trigger's name (`periodic`, `count`, `threshold`, `cost_aware`).
    """

    switch: bool
    strategy: str
    reason: str
    expected_gain_s: float
    trigger: str


def expected_gain_s(current: StrategyEvaluation, candidate: StrategyEvaluation, horizon_s: float) -> float:
    """Makespan saved over `horizon_s` seconds by `candidate` vs `current`: H * (1 - mm_new / mm_cur).

    mm is max/mean of the sampled loads (`keyshift.monitoring.balance.max_over_mean`, >= 1).
    Returns seconds; negative when the candidate is worse.
    """
    return horizon_s * (1.0 - candidate.max_over_mean / current.max_over_mean)


@runtime_checkable
class SwitchPolicy(Protocol):
    """The interface of every switch trigger.

    Attributes:
        name: `periodic`, `count`, `threshold` or `cost_aware`.
    """

    name: str

    def observe(self, evaluation: Evaluation, now_s: float, events: int) -> Decision:
        """Decide after one evaluation at time `now_s` (seconds), `events` events since the last call."""
        ...

    def record_switch(self, strategy_from: str, strategy_to: str, now_s: float, migration_s: float | None = None) -> None:
        """Note that a switch from `strategy_from` to `strategy_to` happened at `now_s` (seconds),
        which took `migration_s` seconds when measured."""
        ...

    def state(self) -> dict[str, float]:
        """What the trigger carries between evaluations (JSON-able), for a scheduler that builds
        a new trigger each time (the `keyshift_balance_monitor` DAG)."""
        ...

    def restore(self, state: dict[str, float]) -> None:
        """Resume from an earlier instance's `state()`."""
        ...


def _check_observation(now_s: float, events: int) -> None:
    if isinstance(events, bool) or not isinstance(events, int) or events < 0:
        raise ConfigurationError(f"events must be an int >= 0, got {events!r}")
    if now_s != now_s:  # NaN
        raise ConfigurationError("now_s must be a number of seconds, got NaN")


class _BestBalance:
    """Shared part of the paper's three modes: when fired, recommend the best balance degree."""

    name = "?"

    def __init__(self, horizon_s: float) -> None:
        if not horizon_s > 0:
            raise ConfigurationError(f"horizon_s must be > 0 seconds, got {horizon_s!r}")
        self.horizon_s = float(horizon_s)

    def _decide(self, evaluation: Evaluation, why: str) -> Decision:
        current, best = evaluation.current, evaluation.best
        gain = expected_gain_s(current, best, self.horizon_s)
        if best.strategy == current.strategy:
            return Decision(False, current.strategy, f"{why}; {current.strategy} in force already has the best balance degree {current.balance_degree:.3f}", 0.0, self.name)
        return Decision(
            True,
            best.strategy,
            f"{why}; {best.strategy} has balance degree {best.balance_degree:.3f} vs {current.balance_degree:.3f} for {current.strategy}",
            gain,
            self.name,
        )

    def _stay(self, evaluation: Evaluation, why: str) -> Decision:
        return Decision(False, evaluation.in_force, why, 0.0, self.name)

    def record_switch(self, strategy_from: str, strategy_to: str, now_s: float, migration_s: float | None = None) -> None:
        """Paper modes keep no switch history; accepted for the common interface."""

    def state(self) -> dict[str, float]:
        """What the trigger carries from one evaluation to the next (JSON-able); none for threshold."""
        return {}

    def restore(self, state: dict[str, float]) -> None:
        """Resume from `state()` of an earlier instance (e.g. the previous scheduled evaluation)."""


class PeriodicPolicy(_BestBalance):
    """Paper 000 Table 6 定期 (periodic): every `period_s` seconds, move to the best balance degree.

    The first call starts the clock (it never fires); afterwards the trigger fires at the first
    call with `now_s - last >= period_s`, and `last` becomes that call's `now_s`.

    Args:
        period_s: T, seconds between firings, > 0.
        horizon_s: horizon of the expected gain, seconds, > 0.

    Raises:
        ConfigurationError: T <= 0 or horizon <= 0; from `observe`, events < 0.
    """

    name = "periodic"

    def __init__(self, period_s: float, horizon_s: float = DEFAULT_HORIZON_S) -> None:
        super().__init__(horizon_s)
        if not period_s > 0:
            raise ConfigurationError(f"period_s must be > 0 seconds, got {period_s!r}")
        self.period_s = float(period_s)
        self._last_s: float | None = None

    def observe(self, evaluation: Evaluation, now_s: float, events: int) -> Decision:
        """Fire when T seconds have passed since the last firing (or the first call)."""
        _check_observation(now_s, events)
        if self._last_s is None:
            self._last_s = now_s
        waited = now_s - self._last_s
        if waited < self.period_s:
            return self._stay(evaluation, f"periodic: {waited:.1f} s of {self.period_s:.1f} s elapsed")
        self._last_s = now_s
        return self._decide(evaluation, f"periodic: {waited:.1f} s >= {self.period_s:.1f} s")

    def state(self) -> dict[str, float]:
        """`{"last_s": seconds}` of the last firing (or of the first call), empty before any call."""
        return {} if self._last_s is None else {"last_s": self._last_s}

    def restore(self, state: dict[str, float]) -> None:
        """Resume the clock of an earlier instance (`state()`); an empty state starts it afresh."""
        self._last_s = float(state["last_s"]) if "last_s" in state else None


class CountPolicy(_BestBalance):
    """Paper 000 Table 6 定量 (count): every `every_events` events, move to the best balance degree.

    Events are summed over calls; the trigger fires at the call that brings the sum to
    >= N, and the sum restarts at 0.

    Args:
        every_events: N, events between firings, >= 1.
        horizon_s: horizon of the expected gain, seconds, > 0.

    Raises:
        ConfigurationError: N < 1 or horizon <= 0; from `observe`, events < 0.
    """

    name = "count"

    def __init__(self, every_events: int, horizon_s: float = DEFAULT_HORIZON_S) -> None:
        super().__init__(horizon_s)
        if isinstance(every_events, bool) or not isinstance(every_events, int) or every_events < 1:
            raise ConfigurationError(f"every_events must be an int >= 1, got {every_events!r}")
        self.every_events = every_events
        self._events = 0

    def observe(self, evaluation: Evaluation, now_s: float, events: int) -> Decision:
        """Fire when N events have arrived since the last firing."""
        _check_observation(now_s, events)
        self._events += events
        if self._events < self.every_events:
            return self._stay(evaluation, f"count: {self._events} of {self.every_events} events")
        seen, self._events = self._events, 0
        return self._decide(evaluation, f"count: {seen} events >= {self.every_events}")

    def state(self) -> dict[str, float]:
        """`{"events": n}`: events summed since the last firing."""
        return {"events": self._events}

    def restore(self, state: dict[str, float]) -> None:
        """Resume the sum of an earlier instance (`state()`)."""
        self._events = int(state.get("events", 0))


class ThresholdPolicy(_BestBalance):
    """Paper 000 Table 6 阈值 (threshold): when the balance degree in force is below θ, move to the best.

    Fires at every call where eq. 1 of the strategy in force is strictly below θ (the paper's
    experiments use θ = 0.6 and 0.4, Table 9).

    Args:
        theta: θ, a balance degree in [0, 1].
        horizon_s: horizon of the expected gain, seconds, > 0.

    Raises:
        ConfigurationError: θ outside [0, 1] or horizon <= 0; from `observe`, events < 0.
    """

    name = "threshold"

    def __init__(self, theta: float, horizon_s: float = DEFAULT_HORIZON_S) -> None:
        super().__init__(horizon_s)
        if not 0 <= theta <= 1:
            raise ConfigurationError(f"theta must be a balance degree in [0, 1], got {theta!r}")
        self.theta = float(theta)

    def observe(self, evaluation: Evaluation, now_s: float, events: int) -> Decision:
        """Fire when the balance degree of the strategy in force is below θ."""
        _check_observation(now_s, events)
        degree = evaluation.current.balance_degree
        if degree >= self.theta:
            return self._stay(evaluation, f"threshold: balance degree {degree:.3f} >= {self.theta:.3f}")
        return self._decide(evaluation, f"threshold: balance degree {degree:.3f} < {self.theta:.3f}")


class CostAwarePolicy:
    """Ours: switch only when it pays (DESIGN.md, "Beyond the papers"), never flapping.

    At each call the candidate is the strategy with the lowest max/mean on the sample (ties: the
    one in force, then evaluation order). It is recommended only when all hold:

    1. gain > cost * (1 + margin), where gain = `expected_gain_s(current, candidate, horizon_s)`
       (makespan saved over the horizon, seconds) and cost = the measured seconds of the last
       migration (`record_switch(..., migration_s=...)`), else `default_cost_s`;
    2. it is not the strategy left at the last switch while less than `cooldown_s` seconds have
       passed since that switch (no A -> B -> A flapping within the cool-down).

    Every reason names the horizon and the cost used and where each came from (`basis`), e.g.
    "horizon 600 s = the monitor's 10-min schedule; cost 12.40 s = median pause of 5 measured switches ...".

    Args:
        horizon_s: H, seconds over which the gain is counted, > 0.
        default_cost_s: migration cost before any is measured, seconds, >= 0; None = `DEFAULT_COST_S`.
        margin: hysteresis margin, >= 0 (0.2 asks for a gain 20 % above the cost).
        cooldown_s: seconds after a switch during which switching back is refused, >= 0.
        horizon_source: where `horizon_s` came from, for the reason (`horizon_default`'s `source`).
        cost_source: where `default_cost_s` came from, for the reason (`migration_cost`'s `source`);
            None = "default_cost_s as given", or "the default, no switch measured" when that is None too.

    Raises:
        ConfigurationError: a parameter out of range; from `observe`, events < 0;
            from `record_switch`, a negative migration time.
    """

    name = "cost_aware"

    def __init__(
        self,
        horizon_s: float = DEFAULT_HORIZON_S,
        default_cost_s: float | None = None,
        margin: float = 0.2,
        cooldown_s: float = 300.0,
        *,
        horizon_source: str = "horizon_s as given",
        cost_source: str | None = None,
    ) -> None:
        if default_cost_s is None:
            default_cost_s, cost_source = DEFAULT_COST_S, cost_source or "the default, no switch measured"
        if not horizon_s > 0:
            raise ConfigurationError(f"horizon_s must be > 0 seconds, got {horizon_s!r}")
        if not default_cost_s >= 0 or not margin >= 0 or not cooldown_s >= 0:
            raise ConfigurationError(
                f"default_cost_s, margin and cooldown_s must be >= 0, got {default_cost_s!r}, {margin!r}, {cooldown_s!r}"
            )
        self.horizon_s = float(horizon_s)
        self.default_cost_s = float(default_cost_s)
        self.margin = float(margin)
        self.cooldown_s = float(cooldown_s)
        self.horizon_source = horizon_source
        self.default_cost_source = cost_source or "default_cost_s as given"
        self.measured_cost_s: float | None = None
        self._measured_source = ""
        self._last_switch: tuple[str, str, float] | None = None  # (from, to, at seconds)

    @property
    def cost_s(self) -> float:
        """The migration cost in use, seconds: the last measured one, else `default_cost_s`."""
        return self.default_cost_s if self.measured_cost_s is None else self.measured_cost_s

    @property
    def cost_source(self) -> str:
        """Where `cost_s` came from: the switch `record_switch` measured it on, else `default_cost_s`'s source."""
        return self.default_cost_source if self.measured_cost_s is None else self._measured_source

    @property
    def basis(self) -> str:
        """The horizon and the cost in use with their sources: "horizon 600 s = ...; cost 10.00 s = ..."."""
        return f"horizon {self.horizon_s:.0f} s = {self.horizon_source}; cost {self.cost_s:.2f} s = {self.cost_source}"

    def record_switch(self, strategy_from: str, strategy_to: str, now_s: float, migration_s: float | None = None) -> None:
        """Note a switch at `now_s` (seconds) and, when measured, the migration's seconds (the new cost).

        Raises:
            ConfigurationError: if `migration_s` is negative.
        """
        if migration_s is not None:
            if not migration_s >= 0:
                raise ConfigurationError(f"migration_s must be >= 0 seconds, got {migration_s!r}")
            self.measured_cost_s = float(migration_s)
            self._measured_source = f"the last measured migration ({strategy_from} -> {strategy_to})"
        self._last_switch = (strategy_from, strategy_to, float(now_s))

    def state(self) -> dict[str, float]:
        """Nothing: the switch history is fed through `record_switch` (kept in Redis by the monitor)."""
        return {}

    def restore(self, state: dict[str, float]) -> None:
        """Nothing to restore; see `state`."""

    def observe(self, evaluation: Evaluation, now_s: float, events: int) -> Decision:
        """Recommend the lowest max/mean when its gain beats cost * (1 + margin) and it is not a flap back.

        The reason names the horizon and the cost with their sources (`basis`)."""
        _check_observation(now_s, events)
        current = evaluation.current
        candidate = min(evaluation.results, key=lambda result: (result.max_over_mean, not result.in_force))
        stay = evaluation.in_force
        if candidate.strategy == current.strategy:
            return Decision(False, stay, f"cost_aware: {stay} in force already has the lowest max/mean {current.max_over_mean:.3f} "
                            f"({self.basis})", 0.0, self.name)
        gain = expected_gain_s(current, candidate, self.horizon_s)
        needed = self.cost_s * (1.0 + self.margin)
        figures = (
            f"{candidate.strategy} max/mean {candidate.max_over_mean:.3f} vs {current.max_over_mean:.3f} saves "
            f"{gain:.2f} s over the horizon; needs > cost x (1 + {self.margin:.2f}) = {needed:.2f} s; {self.basis}"
        )
        if gain <= needed:
            return Decision(False, stay, f"cost_aware: does not pay: {figures}", gain, self.name)
        if self._last_switch is not None:
            left, _, at = self._last_switch
            since = now_s - at
            if candidate.strategy == left and since < self.cooldown_s:
                return Decision(
                    False,
                    stay,
                    f"cost_aware: cool-down: {candidate.strategy} was left {since:.0f} s ago (< {self.cooldown_s:.0f} s); {figures}",
                    gain,
                    self.name,
                )
        return Decision(True, candidate.strategy, f"cost_aware: pays: {figures}", gain, self.name)


POLICY_NAMES: tuple[str, ...] = ("periodic", "count", "threshold", "cost_aware")
"""Names `policy_by_name` accepts."""


def policy_by_name(name: str, **options: float | str | None) -> SwitchPolicy:
    """Build a trigger by name with its keyword options.

    periodic: `period_s`; count: `every_events`; threshold: `theta`; cost_aware: `default_cost_s`,
    `margin`, `cooldown_s`, and `horizon_source`, `cost_source` (text for its reasons); all take
    `horizon_s` (seconds).

    Raises:
        ConfigurationError: an unknown name (lists the known ones), or an option it does not take.
    """
    classes = {"periodic": PeriodicPolicy, "count": CountPolicy, "threshold": ThresholdPolicy, "cost_aware": CostAwarePolicy}
    try:
        cls = classes[name]
    except KeyError:
        raise ConfigurationError(f"unknown trigger {name!r}; known: {', '.join(POLICY_NAMES)}") from None
    try:
        return cls(**options)
    except TypeError as exc:
        raise ConfigurationError(f"trigger {name!r} does not take options {sorted(options)}: {exc}") from exc
