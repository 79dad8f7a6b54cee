"""The scheduled balance monitor and the switch request: what `keyshift_balance_monitor` and
`keyshift_switch` (and `keyshift balance evaluate --topic`) call.

A scheduled monitor run evaluates every live job run (`evaluation_targets`: run records in state
running or restarting, one mapped `evaluate` per run, `evaluate_target`), then `switch_requests`
keeps at most one switch per topic, re-checks each against its run's record (`skip_reason`) and
notes every outcome in the monitor's record (`note_on_decision`).

One evaluation of a topic (`evaluate_topic`):

1. read the topic's offsets; the records that arrived since the previous evaluation are the
   offsets between the previous end offsets (the cursor in Redis: the job run's own, so two runs
   on one topic each count from their own last evaluation) and the current ones;
2. **arrivals**: those deltas are the events each slot (partition) received: measured loads;
3. **processed**: the job run reading the topic (the `run_id` param, else the latest live run
   recorded in Redis, else the latest run of the topic) reports its processed events per slot; the difference from the previous
   evaluation's counts is what each slot processed in between. That run's record also says
   which strategy and P are in force (`placement_in_force`): a switch changes them, and the
   `strategy` and `partitions` params only stand in when no run is recorded;
4. **sample**: the most recent of the arrived records, at most `max_events`, are read and their
   keys sampled (every n-th or a seeded fraction); every candidate strategy is scored on the
   sample (paper 000 eq. 1, eq. 2, max/mean);
5. the trigger (paper 000 Table 6, or cost_aware with the switch history kept in Redis)
   decides, counting the expected gain over the evaluation interval (`EVALUATION_INTERVAL`, the
   DAG's schedule) unless `horizon_s` is set, cost_aware counting the measured pause of a switch
   (`trigger_costs`: the topic's last, else the median of the newest of any run); the record
   (sampled figures, measured loads, decision) goes to the Parquet history and to Redis (latest + recent series) together with the new cursor, and a switch decision
   becomes the last switch;
6. a switch decision yields the conf of a `keyshift_switch` run (`switch_conf`), naming the
   job run to switch; when that run is not live (none reads the topic, or it finished) there is
   no conf and the record's `switch_request` says why.

`keyshift_switch` then calls `record_switch_request` (validate, resolve the run, record the
request) and `keyshift.orchestration.switching.carry_out` (the switch itself,
`keyshift.migration.switch.request_switch`).

Nothing here connects to anything at import time.
"""

from __future__ import annotations

import json
import logging
import math
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from keyshift import names
from keyshift.errors import ConfigurationError, PlacementError
from keyshift.monitoring.results import DEFAULT_KEEP
from keyshift.settings import Settings
from keyshift.names import RunDir
from keyshift.runs import RunRecord

if TYPE_CHECKING:
    from keyshift.monitoring.results import LastSwitch
    from keyshift.monitoring.switch_policies import MeasuredSwitch, SourcedSeconds

log = logging.getLogger(__name__)

EVALUATION_INTERVAL = timedelta(minutes=10)
"""How often `keyshift_balance_monitor` evaluates a topic: the DAG's schedule (defined here only).
A decision stands until the next evaluation, so it is also the switch policies' default horizon."""

EVALUATION_INTERVAL_S = EVALUATION_INTERVAL.total_seconds()
"""`EVALUATION_INTERVAL` in seconds (600.0): the default `horizon_s` (`switch_policies.horizon_default`)."""


def evaluation_interval(settings: Settings) -> timedelta:
    """The `keyshift_balance_monitor` schedule: `settings.monitor_interval_s` (`KEYSHIFT_MONITOR_INTERVAL_S`;
    default `EVALUATION_INTERVAL`, 10 minutes) as a timedelta. Read when the dag-processor parses the
    DAG: the environment only, no connection or file."""
    return timedelta(seconds=settings.monitor_interval_s)


DEFAULT_CANDIDATES: tuple[str, ...] = ("hash", "modulo", "least_key", "least_count", "hot_split")
"""Strategies the monitor may recommend by default: those the flight delay job can run
(`keyshift.processing.job_query.JOB_STRATEGIES`; a test keeps the two equal). modulo is
left out of an evaluation by itself when the keys are not integers."""

SWITCH_REQUESTS_KEPT = 100
"""Switch requests kept per topic in Redis (`names.redis_switch_requests_key`)."""


def _check_label(label: str) -> str:
    from keyshift.monitoring.evaluate import variant_by_label

    variant_by_label(label)
    return label


class MonitorParams(BaseModel):
    """Parameters of one monitor evaluation (the DAG's params, the CLI's options).

    Attributes:
        topic: the monitored input topic. strategy: label of the strategy in force.
        partitions: P of the evaluation; None = the topic's partition count.
        trigger: `periodic`, `count`, `threshold` (paper 000 Table 6) or `cost_aware` (ours).
        theta: threshold's θ (balance degree). period_s: periodic's T (seconds).
        every_events: count's N (events). horizon_s: H of the expected gain (seconds); None =
            the evaluation interval (`EVALUATION_INTERVAL_S`, 600 s; `switch_policies.horizon_default`).
        cost_s, margin, cooldown_s: cost_aware's migration cost until the topic has a measured
            switch (seconds; None = the median pause of the newest measured switches of any run,
            else `switch_policies.DEFAULT_COST_S`: `switch_policies.migration_cost`), hysteresis margin, and
            cool-down against switching back (seconds).
        sample_every: keep every n-th event read; when None, `sample_fraction` (a seeded share
            in (0, 1]) applies. seed: the sampler's seed.
        max_events: at most this many of the arrived records are read (the most recent).
        run_id: the job run whose per-slot counts are read; None = the latest run on the topic.
        candidates: strategies scored and possibly recommended (the one in force always is).
        keep: records kept in the Redis series.

    Raises:
        pydantic.ValidationError (wrapped in ConfigurationError by `monitor_params`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str = names.FLIGHTS_TOPIC
    strategy: str = "hash"
    partitions: int | None = Field(None, ge=1)
    trigger: Literal["periodic", "count", "threshold", "cost_aware"] = "cost_aware"
    theta: float = Field(0.6, ge=0, le=1)
    period_s: float = Field(3600.0, gt=0)
    every_events: int = Field(1_000_000, ge=1)
    horizon_s: float | None = Field(None, gt=0)
    cost_s: float | None = Field(None, ge=0)
    margin: float = Field(0.2, ge=0)
    cooldown_s: float = Field(300.0, ge=0)
    sample_fraction: float = Field(0.1, gt=0, le=1)
    sample_every: int | None = Field(None, ge=1)
    seed: int = 0
    max_events: int = Field(100_000, ge=1)
    run_id: str | None = None
    candidates: tuple[str, ...] = DEFAULT_CANDIDATES
    keep: int = Field(DEFAULT_KEEP, ge=1)

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        return _check_label(value)

    @field_validator("candidates")
    @classmethod
    def _known_candidates(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_check_label(label) for label in value)

    @field_validator("topic")
    @classmethod
    def _legal_topic(cls, value: str) -> str:
        from keyshift.topics import check_topic_names

        return check_topic_names([value])[0]

    def horizon(self, interval_s: float = EVALUATION_INTERVAL_S) -> SourcedSeconds:
        """H of the expected gain, seconds, with its source: `horizon_s` when set, else the
        evaluation interval `interval_s` (seconds; the schedule's period, `Settings.monitor_interval_s`;
        `switch_policies.horizon_default`)."""
        from keyshift.monitoring.switch_policies import horizon_default

        return horizon_default(self.horizon_s, interval_s)

    def trigger_options(self, cost: SourcedSeconds | None = None, interval_s: float = EVALUATION_INTERVAL_S) -> dict[str, Any]:
        """Keyword options of `switch_policies.policy_by_name` for `trigger`.

        Args:
            cost: cost_aware's migration cost with its source (`trigger_costs`, which reads the
                measured switches in Redis); None = `cost_s` when set, else `switch_policies.DEFAULT_COST_S`.
            interval_s: the evaluation interval, seconds (`horizon`).

        Every trigger gets `horizon_s` = `horizon()`; cost_aware also gets the sources of the
        horizon and the cost, which its reasons name.
        """
        from keyshift.monitoring.switch_policies import migration_cost

        horizon = self.horizon(interval_s)
        options: dict[str, Any] = {"horizon_s": horizon.seconds}
        if self.trigger == "periodic":
            options["period_s"] = self.period_s
        elif self.trigger == "count":
            options["every_events"] = self.every_events
        elif self.trigger == "threshold":
            options["theta"] = self.theta
        else:
            cost = cost or migration_cost(self.cost_s, None, ())
            options.update(default_cost_s=cost.seconds, margin=self.margin, cooldown_s=self.cooldown_s,
                           horizon_source=horizon.source, cost_source=cost.source)
        return options


def monitor_params(raw: dict[str, Any]) -> MonitorParams:
    """Validate raw params (a DAG run's params, CLI options); None values take the defaults.

    Raises:
        ConfigurationError: a bad value; the message lists every problem.
    """
    given = {k: v for k, v in raw.items() if v is not None}
    if isinstance(given.get("candidates"), list):
        given["candidates"] = tuple(given["candidates"])
    if not given.get("candidates"):
        given.pop("candidates", None)
    try:
        return MonitorParams(**given)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'params'}: {e['msg']}" for e in exc.errors())
        raise ConfigurationError(f"bad monitor parameters: {problems}") from exc


def measured_switches(client: Any, per_run: int | None = None) -> list[MeasuredSwitch]:
    """Finished switches with a measured pause, of every run whose switch history is in Redis, newest first.

    Reads the newest `per_run` records (default `switch_policies.RECENT_SWITCHES`) of each
    `keyshift:switch:run:<run_id>:history` list (`keyshift.migration.switch.SwitchControl`
    pushes every finished switch there, newest first), so the overall newest `per_run` are among
    them. A record counts when its `state` is `done` and its `pause_seconds` (the old query's last
    commit, its barrier batch's, to the new query's first commit, seconds) is a number >= 0; failed and rolled-back switches do not.

    Args:
        client: a Redis client with `decode_responses=True`.
        per_run: records read per run, >= 1.

    Raises:
        StackError: Redis is unreachable.
    """
    import redis

    from keyshift.errors import StackError
    from keyshift.migration.switch_record import SwitchRecord
    from keyshift.monitoring.switch_policies import RECENT_SWITCHES, MeasuredSwitch

    per_run = per_run or RECENT_SWITCHES
    try:
        keys = sorted(client.scan_iter(match=names.redis_switch_history_key("*"), count=1000))
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.lrange(key, 0, per_run - 1)
            lists = pipe.execute() if keys else []
    except redis.RedisError as exc:
        raise StackError(f"Redis does not answer for the switch histories ({exc}); run `keyshift stack up`") from exc
    found = []
    for key, texts in zip(keys, lists):
        for text in texts:
            try:
                record = SwitchRecord.from_json(json.loads(text))
            except (ValueError, ConfigurationError) as exc:
                log.warning("%s holds a record that is not a switch record (%s); skipped", key, exc)
                continue
            pause, finished = record.pause_seconds, record.finished_at
            if record.state != "done" or isinstance(pause, bool) or not isinstance(pause, (int, float)) or not pause >= 0:
                continue
            found.append(MeasuredSwitch(float(pause), record.switch_id, record.topic,
                                        float(finished) if isinstance(finished, (int, float)) else None))
    found.sort(key=lambda s: -s.finished_at_s if s.finished_at_s is not None else math.inf)
    return found


def trigger_costs(client: Any, topic: str, cost_s: float | None, last: LastSwitch | None) -> SourcedSeconds:
    """cost_aware's migration cost for `topic`, seconds, with its source (`switch_policies.migration_cost`).

    1. the topic's last measured switch: `migration_s` of the topic's last switch in Redis
       (`keyshift:balance:<topic>:last_switch`, which the driver writes when a switch is done),
       named by the switch id of the switch history record with that topic and pause; when that
       hash holds no measured cost, the newest measured switch of the topic in the histories;
    2. `cost_s` when set;
    3. the median pause of the `switch_policies.RECENT_SWITCHES` newest measured switches of any run and
       topic (`measured_switches`);
    4. `switch_policies.DEFAULT_COST_S`.

    Args:
        client: a Redis client with `decode_responses=True`. topic: the monitored topic.
        cost_s: the `cost_s` param (seconds) or None. last: the topic's last switch (`ResultStore.last_switch`).

    Raises:
        StackError: Redis is unreachable.
    """
    from keyshift.monitoring.switch_policies import MeasuredSwitch, migration_cost

    switches = measured_switches(client)
    ours = [s for s in switches if s.topic == topic]
    if last is not None and last.migration_s is not None:
        same = next((s for s in ours if math.isclose(s.pause_s, last.migration_s, abs_tol=1e-6)), None)
        topic_last: MeasuredSwitch | None = MeasuredSwitch(last.migration_s, same.switch_id if same else None, topic, last.at_s)
    else:
        topic_last = ours[0] if ours else None
    return migration_cost(cost_s, topic_last, switches)


def _published_in_force(settings: Settings, topic: str, strategy: str, partitions: int):
    """The learned strategy in force as published in Redis under `topic` (a local copy), or None.

    None for a rule strategy (hash: nothing to read), when nothing is published, or when the
    published assignment is another strategy's or another P's (then the evaluation rebuilds the
    strategy from the sample, and says so in the record's `in_force_assignment`).
    """
    from keyshift.placement.assignment_store import AssignmentStore, strategy_from_snapshot
    from keyshift.processing.job_config import LEARNED_STRATEGIES

    if strategy not in LEARNED_STRATEGIES:
        return None
    try:
        snapshot = AssignmentStore.from_settings(settings, topic).snapshot()
    except PlacementError:
        log.warning("%s: no %s assignment published in Redis; scoring it as rebuilt from the sample", topic, strategy)
        return None
    if snapshot["strategy"] != strategy or snapshot["partitions"] != partitions:
        log.warning("%s: the published assignment is %s over %d slots, not %s over %d; scoring %s as rebuilt from the sample",
                    topic, snapshot["strategy"], snapshot["partitions"], strategy, partitions, strategy)
        return None
    log.info("%s: scoring %s with its published assignment (epoch %d, %d units)", topic, strategy, snapshot["epoch"], len(snapshot["mapping"]))
    return strategy_from_snapshot(snapshot)


def evaluate_topic(
    settings: Settings, params: MonitorParams, *, now: datetime | None = None, save: bool = True, monitor_run_id: str | None = None,
    record_switch: bool = True,
) -> dict[str, Any]:
    """One evaluation of `params.topic` (steps in the module docstring).

    Args:
        settings: where Kafka, Redis and `runs/` are.
        params: validated parameters (`monitor_params`).
        now: the evaluation's time (UTC; default now). The triggers' clock is its epoch seconds.
        save: store the record, the cursor and the switch (False: a dry run that moves nothing).
        monitor_run_id: the Airflow run id, recorded for tracing.
        record_switch: store a decision that yields a switch conf as the topic's last switch (the
            cost_aware trigger's history) with the record; False when the caller records it only
            once it requests the switch (`switch_requests`, the DAG).

    Returns:
        `{"record": the stored record (`evaluate.evaluation_record` shape, plus `series`, `topic`,
        sampling fields, `measured` arrivals/processed, `horizon_s` and `horizon_source`, and for
        cost_aware `cost_s` and `cost_source`: what the decision counted), "switch_conf": the `keyshift_switch`
        conf when the decision is to switch, else None}`. When nothing was sampled (no event
        arrived) the record's `evaluation` is None and the decision is to stay. The record's
        `rescale` is the parallelism recommended for the stateful stage (`_rescale`, paper 001),
        or None with `rescale_reason` saying why; a recommended P other than the one in force
        becomes the conf's `partitions`, with the strategy switch or alone (when
        `SwitchRequest` takes it; `rescale["switch"]` says what was asked).

    Raises:
        ConfigurationError: the topic does not exist; `run_id` names no recorded run; P bad.
        StackError: Kafka or Redis is unreachable.
    """
    from keyshift.monitoring.evaluate import evaluate_sample, evaluation_record, save_evaluation
    from keyshift.monitoring.loads import (
        arrival_ranges, arrivals, bounded_ranges, job_counts, job_offsets, latest_job_run, measured_loads, since_previous,
    )
    from keyshift.orchestration.pipeline import consumer_lag
    from keyshift.monitoring.results import LastSwitch, ResultStore, balance_dir
    from keyshift.monitoring.sampling import Sampler
    from keyshift.monitoring.stream import read_offsets, sample_topic
    from keyshift.monitoring.switch_policies import Decision, policy_by_name
    from keyshift.runs import LIVE_STATES

    at = now or datetime.now(timezone.utc)
    now_s = at.timestamp()
    topic = params.topic
    store = ResultStore.from_settings(settings, topic, params.keep)
    # the topic's live run, else its latest run (its counts measure the topic; it is not switched)
    run_id = params.run_id or latest_job_run(store.client, topic, LIVE_STATES) or latest_job_run(store.client, topic)
    store = ResultStore.from_settings(settings, topic, params.keep, run_id=run_id)  # with the run's own cursor
    cursor = store.cursor()
    offsets = read_offsets(settings, topic)
    previous = {int(p): int(o) for p, o in (cursor.get("end_offsets") or {}).items()}
    ranges = arrival_ranges(previous or None, offsets.end, offsets.beginning)
    arrived = arrivals(ranges)
    since = f"since {datetime.fromtimestamp(cursor['at_s'], timezone.utc).isoformat()}" if "at_s" in cursor else "since the topic's oldest record"
    measured = [measured_loads("arrivals", arrived, f"Kafka end-offset deltas of {topic!r} {since}")]

    raw = store.client.hgetall(names.redis_run_key(run_id)) if run_id else {}
    run = RunRecord.from_redis(raw) if raw else None
    params, in_force_source = placement_in_force(run, params)
    counts = job_counts(store.client, settings.runs_dir, run_id) if run_id else None
    if counts is not None:
        processed = since_previous(cursor.get("job_run_id"), cursor.get("job_per_slot_events"), counts)
        span = "since the previous evaluation" if processed != list(counts.per_slot_events) else "since the run started"
        measured.append(measured_loads("processed", processed, f"job run {run_id} ({counts.state}), {counts.source} {counts.path}, {span}"))
    else:
        log.info("no per-slot counts of a job run on %r (run id %s)", topic, run_id)
    read_to = job_offsets(store.client, settings.runs_dir, run_id) if run_id else None
    lag = consumer_lag(offsets.end, read_to) if read_to is not None else None
    if lag is not None:
        log.info("%s: consumer lag of job run %s: %d records (%s)", topic, run_id, sum(lag.values()),
                 ", ".join(f"{p}: {n}" for p, n in lag.items()))

    rescale, rescale_reason, flow_cursor = _rescale(settings, cursor, run_id, lag, now_s)

    sampler = Sampler(every=params.sample_every) if params.sample_every else Sampler(fraction=params.sample_fraction, seed=params.seed)
    read = bounded_ranges(ranges, params.max_events)
    sample = sample_topic(settings, topic, read, sampler)
    partitions = params.partitions or len(offsets.end)
    context = {
        "series": topic, "topic": topic, "source": f"kafka:{topic}", "key": "record key", "monitor_run_id": monitor_run_id,
        "trigger": params.trigger, "sample_rule": "every" if params.sample_every else "fraction", "sample_rate": sampler.rate,
        "seed": params.seed, "max_events": params.max_events, "events_arrived": sum(arrived), "events_read": sample.read,
        "events_seen": sampler.seen, "events_sampled": sampler.sampled, "job_run_id": run_id,
        "ranges_read": {str(p): list(r) for p, r in sample.ranges.items()},
        "consumer_lag": {"total": sum(lag.values()), "per_partition": {str(p): n for p, n in lag.items()}} if lag is not None else None,
        "rescale": rescale, "rescale_reason": rescale_reason, "in_force_source": in_force_source,
    }

    last = store.last_switch()
    horizon = params.horizon(settings.monitor_interval_s)
    cost = trigger_costs(store.client, topic, params.cost_s, last) if params.trigger == "cost_aware" else None
    context.update({"horizon_s": horizon.seconds, "horizon_source": horizon.source})
    if cost is not None:
        context.update({"cost_s": cost.seconds, "cost_source": cost.source})
    trigger = policy_by_name(params.trigger, **params.trigger_options(cost, settings.monitor_interval_s))
    if cursor.get("trigger") == params.trigger:
        trigger.restore(cursor.get("trigger_state") or {})
    if last is not None:
        # the measured cost of the topic's last switch is already in `cost` (with its switch id)
        trigger.record_switch(last.strategy_from, last.strategy_to, last.at_s)

    in_force = _published_in_force(settings, topic, params.strategy, partitions)
    context["in_force_assignment"] = f"published epoch {in_force.epoch}" if in_force is not None else "rebuilt from the sample"

    evaluation = None
    if sampler.counts:
        evaluation = evaluate_sample(sampler.counts, partitions, params.strategy, assignment=in_force, labels=params.candidates)
        decision = trigger.observe(evaluation, now_s, sum(arrived))
    else:
        basis = f" ({trigger.basis})" if isinstance(getattr(trigger, "basis", None), str) else ""
        decision = Decision(False, params.strategy, f"{params.trigger}: no events sampled ({sum(arrived)} arrived {since}); "
                            f"nothing to rebalance{basis}", 0.0, params.trigger)
    log.info("%s: %s -> %s (%s); expected gain %.2f s; %s", topic, params.strategy,
             decision.strategy, "switch" if decision.switch else "stay", decision.expected_gain_s, decision.reason)

    history_file = None
    if save and evaluation is not None:
        history_file = str(save_evaluation(balance_dir(settings, topic), evaluation, decision, at=at, context=context, measured=measured))
    if evaluation is not None:
        record = evaluation_record(evaluation, decision, at=at, context=context, measured=measured, history_file=history_file)
    else:
        record = _record_without_sample(at, context, decision, measured)
    conf = switch_conf(record, params, monitor_run_id) if decision.switch else None
    not_live = None if run is not None and run.state in LIVE_STATES else (
        f"no live job run reads {topic!r}: nothing to switch" if run is None else
        f"run {run_id} is {run.state}, not live: only a live run is switched")
    if rescale is not None and rescale["recommended"] != rescale["current"] and not_live is None:
        # a change of P goes through the same switch: with the strategy switch, or on its own
        alone = conf is None
        conf = conf or {
            "topic": topic, "run_id": run_id, "strategy_from": params.strategy, "strategy": params.strategy,
            "partitions_from": partitions, "reason": rescale["why"], "expected_gain_s": 0.0,
            "trigger": params.trigger, "decided_at": record["at"], "monitor_run_id": monitor_run_id,
        }
        conf["partitions"] = rescale["recommended"]
        try:
            SwitchRequest(**conf)
            rescale["switch"] = f"requested: P {rescale['current']} -> {rescale['recommended']}" + ("" if alone else f" with the switch to {decision.strategy}")
        except ValidationError as exc:
            rescale["switch"] = f"not requested: keyshift_switch would refuse it ({exc.errors()[0]['msg']})"
            conf = None
        log.info("%s: rescale %s", topic, rescale["switch"])
    if conf is not None and not_live is not None:
        conf = None
        record["switch_request"] = {"state": "skipped", "reason": not_live}
        log.warning("%s: switch to %s not requested: %s", topic, decision.strategy, not_live)
    switch = LastSwitch(now_s, params.strategy, decision.strategy) if record_switch and decision.switch and conf is not None else None
    if save:
        store.save(record, cursor={
            "at_s": now_s,
            "end_offsets": {str(p): o for p, o in offsets.end.items()},
            "job_run_id": run_id if counts is not None else None,
            "job_per_slot_events": list(counts.per_slot_events) if counts is not None else None,
            "trigger": params.trigger,
            "trigger_state": trigger.state(),
            **flow_cursor,
        }, switch=switch)
    return {"record": record, "switch_conf": conf}


def placement_in_force(run_record: RunRecord | None, params: MonitorParams) -> tuple[MonitorParams, str]:
    """`params` with the strategy and P in force, and where they come from.

    The job run's Redis record (`names.redis_run_key`) carries the strategy and P of its current
    segment: the launcher writes them, and the driver rewrites them (with `epoch` and `segment`)
    at each switch. When the record has them they are in force, whatever the `strategy` and
    `partitions` params say (those label a topic no recorded run reads); so after a switch the
    monitor scores the new placement and does not ask for the same switch again.

    Args:
        run_record: the run record (None when no run is recorded). params: validated params.

    Returns:
        (params with `strategy` and `partitions` in force, `"run record <run_id> (epoch e, segment s)"` or `"monitor params"`).
    """
    if run_record is None or not run_record.strategy or run_record.partitions is None:
        return params, "monitor params"
    strategy, partitions = run_record.strategy, run_record.partitions
    epoch = "?" if run_record.epoch is None else run_record.epoch
    source = f"run record {run_record.run_id} (epoch {epoch}, segment {run_record.segment or 0})"
    given = params.partitions or "the topic's"
    said = f"{params.strategy} over {given}"
    log.info("%s: in force per %s: %s over %s slots%s", params.topic, source, strategy, partitions,
             "" if said == f"{strategy} over {partitions}" else f" (the monitor's params say {said} slots)")
    return params.model_copy(update={"strategy": _check_label(strategy), "partitions": int(partitions)}), source


def _rescale(
    settings: Settings, cursor: dict[str, Any], run_id: str | None, lag: dict[int, int] | None, now_s: float, *,
    slots_per_core: float = 4.0, kept: int = 12,
) -> tuple[dict[str, Any] | None, str | None, dict[str, Any]]:
    """When to rescale (paper 001): `keyshift.monitoring.flow.recommend_parallelism` on the job run's batches.

    Reads `runs/<run_id>/progress.jsonl` (its newest `flow.MAX_BATCHES` lines) and, once the run
    wrote it, `task_seconds.json`; the consumer lag of this evaluation joins the cursor's
    `lag_history` (the last `kept` observations of the run at its P; a new run or P starts a new
    one) and the learned capacities come from and go back to the cursor's `flow_state`. The job's
    cores: N of `local[N]`, else this machine's CPU count (`local[*]`, or a cluster: an estimate).
    `slots_per_core` caps P at cores × 4: keyshift runs P = 8 on `local[2]`, and Spark's tuning
    guide suggests 2-3 tasks per core, so this is the most slots a core may serve here.

    Returns:
        (the recommendation as a record, or None; why there is none, or None; the cursor fields
        `lag_history` and `flow_state` to save).
    """
    import os
    from collections import deque

    from keyshift.monitoring.flow import MAX_BATCHES, recommend_parallelism
    from keyshift.stack.spark_cluster import master_cores

    progress: list[dict[str, Any]] = []
    path = RunDir.of(settings.runs_dir, run_id or "-").progress
    if run_id and path.is_file():
        with path.open(encoding="utf-8") as lines:
            for line in deque(lines, maxlen=MAX_BATCHES):
                try:
                    progress.append(json.loads(line))
                except ValueError:  # a line the driver is still appending
                    continue
    partitions = len(progress[-1].get("processed_rows_per_slot") or []) if progress else None
    history = cursor.get("lag_history") or {}
    same = history.get("run_id") == run_id and history.get("partitions") == partitions
    points = [tuple(point) for point in history.get("points", [])] if same else []
    if lag is not None and run_id:
        points.append((now_s, sum(lag.values())))
    update: dict[str, Any] = {"lag_history": {"run_id": run_id, "partitions": partitions, "points": [list(p) for p in points[-kept:]]}}
    if not progress:
        return None, f"no progress of a job run on the topic yet (run id {run_id})", update
    timed = RunDir.of(settings.runs_dir, run_id).task_seconds
    try:
        task_seconds = json.loads(timed.read_text(encoding="utf-8")) if timed.is_file() else None
    except ValueError:  # being written at the run's end
        task_seconds = None
    cores = master_cores(settings) or os.cpu_count() or 1
    found = recommend_parallelism(progress, points[-kept:], cursor.get("flow_state"), cores=cores, slots_per_core=slots_per_core,
                                  task_seconds=task_seconds)
    update["flow_state"] = found.state
    log.info("run %s: rescale %s -> %s (%s)", run_id, found.current, found.recommended, found.why)
    if found.recommended is None:
        return None, found.why, update
    return {**found.as_record(), "cores": cores, "slots_per_core": slots_per_core}, None, update


def _record_without_sample(at: datetime, context: dict[str, Any], decision: object, measured: list) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "at": at.isoformat(), "at_s": at.timestamp(), **context, "evaluation": None, "decision": asdict(decision),
        "measured": {m.source: {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(m).items()} for m in measured},
        "history_file": None,
    }


def switch_conf(record: dict[str, Any], params: MonitorParams, monitor_run_id: str | None = None) -> dict[str, Any]:
    """The conf of a `keyshift_switch` run for a record whose decision is to switch (`SwitchRequest` fields).

    `params` holds the strategy and P in force (`placement_in_force`); `run_id` is the job run the
    evaluation read (`job_run_id`; None when no run is recorded: `keyshift_switch` then takes the
    latest running one on the topic).

    Raises:
        ConfigurationError: the record's decision is not a switch.
    """
    decision = record.get("decision") or {}
    if not decision.get("switch"):
        raise ConfigurationError(f"the decision of {record.get('at')} is to stay on {decision.get('strategy')}; no switch to request")
    partitions = int(record["evaluation"]["partitions"])
    return {
        "topic": params.topic,
        "run_id": record.get("job_run_id"),
        "strategy_from": params.strategy,
        "strategy": decision["strategy"],
        "partitions_from": partitions,
        "partitions": partitions,
        "reason": decision["reason"],
        "expected_gain_s": float(decision["expected_gain_s"]),
        "trigger": decision["trigger"],
        "decided_at": record["at"],
        "monitor_run_id": monitor_run_id,
    }


def evaluation_targets(settings: Settings, raw: dict[str, Any]) -> list[dict[str, Any]]:
    """What one `keyshift_balance_monitor` run evaluates: one target per live job run (the mapped
    `evaluate` task's instances), each `{"topic", "run_id", "label"}`.

    Each target also names the run's `job` (None when the record names none), whose strategies
    bound the candidates (`evaluate_target`).

    * neither `topic` nor `run_id` in `raw` (the schedule's runs): every live job run keyshift
      knows (`keyshift.runs.live_run_records`: state running or restarting), each on its own topic;
    * `topic` (a run by hand for one topic): the topic's live runs, or when none reads it, the topic
      alone (`run_id` None: arrivals and the sample are scored; nothing can be switched);
    * `run_id`: that run, which must be live.

    Two live runs on one topic are two targets (each is measured with its own cursor); at most
    one of them is switched per monitor run (`switch_requests`).

    Args:
        settings: where Redis is. raw: the DAG run's params (None = not given).

    Returns:
        The targets, oldest run first ([] when no run is live: the mapped task is skipped).

    Raises:
        ConfigurationError: `run_id` names no run, or one that is not live (finished runs are not evaluated).
        StackError: Redis is unreachable.
    """
    from keyshift.runs import LIVE_STATES, live_run_records, redis_client, run_record

    topic, run_id = raw.get("topic") or None, raw.get("run_id") or None
    if run_id is not None:
        record = run_record(settings, run_id)
        if record is None or record.state not in LIVE_STATES:
            state = "not recorded in Redis" if record is None else f"{record.state}"
            raise ConfigurationError(f"run {run_id!r} is {state}: the monitor evaluates live runs only (state "
                                     f"{' or '.join(sorted(LIVE_STATES))}); leave run_id empty to evaluate every live run")
        runs = [record]
    else:
        runs = [r for r in live_run_records(redis_client(settings)) if topic is None or r.topic == topic]
    targets = [{"topic": r.topic or topic or names.FLIGHTS_TOPIC, "run_id": r.run_id, "job": r.job} for r in runs]
    if not targets and topic is not None:
        targets = [{"topic": topic, "run_id": None}]
    for target in targets:
        target["label"] = f"{target['run_id'] or 'no live run'} on {target['topic']}"
    log.info("%d evaluation(s): %s", len(targets), "; ".join(t["label"] for t in targets) or "no live job run")
    return targets


def evaluate_target(settings: Settings, raw: dict[str, Any], target: dict[str, Any], monitor_run_id: str | None = None) -> dict[str, Any]:
    """One mapped `evaluate`: `evaluate_topic` of `target`'s topic and run (`evaluation_targets`),
    with the DAG run's other params; the strategy and P in force come from the run's record. The
    candidates are those of `raw` the run's job can run (`DEFAULT_CANDIDATES` for the flights;
    `pipeline.JOB_STRATEGIES` for the others: YSB runs hash,
    least_key and least_count; when none of them is, the job's own), so a decision never names a
    strategy its job cannot switch to.

    Raises:
        ConfigurationError, StackError: from `monitor_params` and `evaluate_topic`.
    """
    from keyshift.orchestration.pipeline import JOB_STRATEGIES

    candidates = list(raw.get("candidates") or DEFAULT_CANDIDATES)
    # the flight delay job runs every default candidate (modulo too, which the pipeline's form leaves out)
    runnable = {**JOB_STRATEGIES, "flight_delays": DEFAULT_CANDIDATES}.get(target.get("job") or "", candidates)
    params = monitor_params({**raw, "topic": target["topic"], "run_id": target.get("run_id"),
                             "candidates": [c for c in candidates if c in runnable] or list(runnable)})
    return evaluate_topic(settings, params, monitor_run_id=monitor_run_id, record_switch=False)  # switch_requests records it


def skip_reason(run: RunRecord | None, run_id: str, strategy_from: str | None, partitions_from: int | None) -> str | None:
    """Why a switch decided for `run_id` on placement (`strategy_from`, `partitions_from`) no
    longer fits the run as its record now stands, or None when it still does.

    Args:
        run: the run's record now (None: none in Redis). strategy_from, partitions_from: what the
            decision saw in force (None: not said, not checked).
    """
    if run is None:
        return f"run {run_id} has no record in Redis any more"
    if run.state != "running":
        return f"run {run_id} is {run.state}, not running: a switch moves a running job"
    changed = [f"{name} was {said!r} and is now {has!r}" for name, said, has in (
        ("strategy", strategy_from, run.strategy), ("P", partitions_from, run.partitions)) if said is not None and said != has]
    if changed:
        return f"the placement of run {run_id} changed since the decision ({', '.join(changed)})"
    return None


def note_on_decision(settings: Settings, conf: dict[str, Any], state: str, reason: str) -> bool:
    """Write what became of a switch decision into the monitor's record of it
    (`switch_request`: `{"state", "reason", "at"}`; `ResultStore.annotate`).

    Args:
        settings: where Redis is. conf: the `keyshift_switch` conf (`switch_conf`: its `topic`,
            `run_id` and `decided_at` name the record). state: `requested` or `skipped`. reason: why.

    Returns:
        True when the record was found (False: a request by hand, or the record left the series).

    Raises:
        StackError: Redis is unreachable.
    """
    from keyshift.monitoring.results import ResultStore

    decided = conf.get("decided_at")
    if not decided or conf.get("trigger", "manual") == "manual":
        return False
    at_s = (decided if isinstance(decided, datetime) else datetime.fromisoformat(str(decided))).timestamp()
    note = {"state": state, "reason": reason, "at": datetime.now(timezone.utc).isoformat()}
    return ResultStore.from_settings(settings, conf["topic"]).annotate(at_s, conf.get("run_id"), {"switch_request": note})


def switch_requests(settings: Settings, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `keyshift_switch` confs to trigger after one monitor run's evaluations (`evaluate_topic` results).

    Per topic at most one switch: the topic's published assignment and its producers' partitioning
    are shared by every run reading it, and a switch publishes a new epoch of them; so of two runs
    on one topic whose decisions are to switch, the one with the larger expected gain is switched
    and the other is skipped (its next evaluation decides again). Each chosen decision is checked
    against its run's record as it is now (`skip_reason`): a run that stopped, or whose placement
    changed, since its evaluation is skipped. Every outcome goes to the task log and to the
    monitor's record of the decision (`note_on_decision`); a requested switch becomes the topic's
    last switch (`ResultStore.record_switch`: the cost_aware trigger's cool-down and history), a
    skipped one does not.

    Raises:
        StackError: Redis is unreachable.
    """
    from keyshift.monitoring.results import LastSwitch, ResultStore
    from keyshift.runs import run_record

    decided = sorted((r["switch_conf"] for r in results if r and r.get("switch_conf")),
                     key=lambda c: -(c.get("expected_gain_s") or 0.0))
    chosen: dict[str, dict[str, Any]] = {}
    confs = []
    for conf in decided:
        topic, run_id = conf["topic"], conf["run_id"]
        first = chosen.get(topic)
        reason = (f"run {first['run_id']} on the same topic {topic!r} is switched by this evaluation (expected gain "
                  f"{first.get('expected_gain_s', 0.0):.2f} s); one switch per topic at a time" if first else
                  skip_reason(run_record(settings, run_id), run_id, conf.get("strategy_from"), conf.get("partitions_from")))
        if reason is not None:
            log.warning("switch of run %s to %s skipped: %s", run_id, conf["strategy"], reason)
            note_on_decision(settings, conf, "skipped", reason)
            continue
        chosen[topic] = conf
        confs.append(conf)
        decided_s = datetime.fromisoformat(str(conf["decided_at"])).timestamp()
        ResultStore.from_settings(settings, topic).record_switch(LastSwitch(decided_s, conf["strategy_from"], conf["strategy"]))
        log.info("switch of run %s on %r requested: %s/P=%s -> %s/P=%s, expected gain %.2f s", run_id, topic, conf["strategy_from"],
                 conf["partitions_from"], conf["strategy"], conf["partitions"], conf.get("expected_gain_s") or 0.0)
        note_on_decision(settings, conf, "requested", f"keyshift_switch triggered for run {run_id}")
    return confs


def check_evaluations(targets: list[dict[str, Any]], results: list[dict[str, Any]]) -> int:
    """Fail when an evaluation of one monitor run failed, once the others' decisions were carried out.

    `switches_decided` and `all_evaluated` run whatever became of the mapped `evaluate` (trigger
    rule all_done), so a run whose evaluation fails (its topic was deleted, its record is stale)
    does not keep the other runs from being balanced; this check then fails the monitor's run,
    naming the runs, so the failure shows in the grid.

    Args:
        targets: `evaluation_targets`. results: the `evaluate_topic` results that were returned.

    Returns:
        The number of runs evaluated.

    Raises:
        JobError: a target without a result (each named by its label).
    """
    from keyshift.errors import JobError

    done = {(r["record"].get("topic"), r["record"].get("job_run_id")) for r in results if r and r.get("record")}
    topics = {topic for topic, _ in done}
    missing = [t["label"] for t in targets if (t["topic"], t["run_id"]) not in done and not (t["run_id"] is None and t["topic"] in topics)]
    if missing:
        raise JobError(f"the evaluation of {len(missing)} of {len(targets)} run(s) failed: {'; '.join(missing)}; see the "
                       f"log of its mapped evaluate task (the other runs' decisions were carried out)")
    return len(targets)


REQUEST_TRIGGERS = ("periodic", "count", "threshold", "cost_aware", "manual")
"""Who asked for a switch: one of the monitor's triggers, or `manual` (the trigger form, by hand)."""


class SwitchRequest(BaseModel):
    """A request to move a job run to another strategy, another P, or both: the conf of a `keyshift_switch` run.

    The monitor's conf fills every field; a request by hand (the trigger form) may give only
    `strategy` (and `partitions`, `run_id`, `reason`): `record_switch_request` fills in the run
    and what is in force from the run's record.

    Attributes:
        topic: the input topic. run_id: the job run to switch; None = the latest running one on
            the topic. strategy: the strategy to move to. strategy_from: the one in force (None:
            read from the run). partitions: P to move to (None: keep P). partitions_from: P in
            force (None: read from the run). reason: why, recorded. expected_gain_s: makespan
            saved over the trigger's horizon, seconds (None by hand). trigger: which trigger
            decided (`REQUEST_TRIGGERS`). decided_at: when (ISO 8601; None by hand).
            monitor_run_id: the monitor's DAG run, if any.

    A request must change something: a strategy other than `strategy_from`, or the same strategy
    with `partitions` other than `partitions_from` (a change of P alone, the monitor's rescale).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str = names.FLIGHTS_TOPIC
    run_id: str | None = None
    strategy: str
    strategy_from: str | None = None
    partitions: int | None = Field(None, ge=1)
    partitions_from: int | None = Field(None, ge=1)
    reason: str = Field(min_length=1)
    expected_gain_s: float | None = None
    trigger: Literal["periodic", "count", "threshold", "cost_aware", "manual"] = "manual"
    decided_at: datetime | None = None
    monitor_run_id: str | None = None

    @field_validator("strategy", "strategy_from")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        return value if value is None else _check_label(value)

    @model_validator(mode="after")
    def _a_change(self) -> SwitchRequest:
        if self.strategy_from is None or self.strategy != self.strategy_from:
            return self
        if self.partitions is None or self.partitions_from is None:
            raise ValueError(f"strategy and strategy_from are both {self.strategy!r} and no change of P is given "
                             f"(partitions {self.partitions}, partitions_from {self.partitions_from}): nothing to switch")
        if self.partitions == self.partitions_from:
            raise ValueError(f"strategy and strategy_from are both {self.strategy!r} and P stays {self.partitions}: nothing to switch")
        return self


def _switch_request(conf: dict[str, Any]) -> SwitchRequest:
    try:
        return SwitchRequest(**conf)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'conf'}: {e['msg']}" for e in exc.errors())
        raise ConfigurationError(f"bad keyshift_switch conf {conf!r}: {problems}") from exc


def _switch_target(settings: Settings, client: Any, request: SwitchRequest) -> RunRecord:
    """The run record of the run `request` switches: its `run_id`, else the latest run on its topic.

    Raises:
        SwitchNotReady: the run is alive but has not started its query yet (starting, restarting,
            or waiting for records: no `job.json`; `keyshift.migration.switch.refuse_unstarted_run`).
        SwitchSkipped: a monitor's decision (`trigger` not `manual`) for a run that is not running (`skip_reason`).
        ConfigurationError: no such run, a run that is not running (a request by hand), or one with a switch under way.
    """
    from keyshift.errors import SwitchSkipped

    from keyshift.migration.switch import SwitchControl, refuse_unstarted_run
    from keyshift.monitoring.loads import latest_job_run

    run_id = request.run_id or latest_job_run(client, request.topic)
    if run_id is None:
        raise ConfigurationError(f"no job run on topic {request.topic!r} is recorded in Redis; start one with keyshift_pipeline "
                                 f"(limit empty: a continuous run), or name the run in the conf's run_id")
    raw = client.hgetall(names.redis_run_key(run_id))
    if not raw:
        raise ConfigurationError(f"run {run_id!r} has no record {names.redis_run_key(run_id)} in Redis; name a run the job recorded")
    record = RunRecord.from_redis({"run_id": run_id, **raw})
    if record.active and not RunDir.of(settings.runs_dir, run_id).job_record.exists():
        refuse_unstarted_run(settings, run_id)  # alive and not started: SwitchNotReady; else why not
    if record.state != "running" and request.trigger != "manual":
        raise SwitchSkipped(f"{skip_reason(record, run_id, None, None)}; the monitor decided at {request.decided_at}, "
                            f"its next evaluation decides again")
    if record.state != "running":
        which = "" if request.run_id else f"the latest job run on topic {request.topic!r}, "
        raise ConfigurationError(f"run {run_id} ({which}state {record.state!r}) is not running: a switch moves a running job; "
                                 f"launch one with keyshift_pipeline, or wait until this one runs")
    under_way = SwitchControl(client, run_id).pending()
    if under_way is not None:
        raise ConfigurationError(f"switch {under_way.switch_id} of run {run_id} to {under_way.strategy_to} is under way "
                                 f"(step {under_way.step}); wait for it, or finish it with `keyshift switch --run {run_id}`")
    return record


def record_switch_request(settings: Settings, conf: dict[str, Any], dag_run_id: str | None = None) -> dict[str, Any]:
    """Validate a `keyshift_switch` conf, resolve its job run and record the request in Redis.

    The run is the conf's `run_id`, else the latest run recorded on the conf's topic; it must be
    running, with no switch under way. What is in force comes from its record (strategy,
    partitions, topic); a `strategy_from` or `partitions_from` in the conf that differs from it
    is a stale decision (the run has switched since) and is skipped (`SwitchSkipped`), as is a
    monitor's decision for a run that is no longer running. The request goes to
    `keyshift:switch:<topic>:requests` (newest first, the last 100 kept).

    Args:
        settings: where Redis is. conf: the run's conf (`SwitchRequest` fields). dag_run_id: the run, for tracing.

    Returns:
        The stored record: the request's fields with the run and what is in force filled in,
        `dag_run_id`, `accepted_at` (ISO 8601), `state` (`requested`), `switch_record_key` (where
        the switch itself is recorded, `keyshift.migration.switch`).

    Raises:
        SwitchNotReady: the run has not started its query yet; nothing is recorded.
        SwitchSkipped: the decision is stale, or a monitor's decision names a run that is not
            running (`skip_reason` says which); nothing is recorded.
        ConfigurationError: the conf is not a valid request (every problem named), or its run
            cannot be switched now.
        StackError: Redis is unreachable.
    """
    from keyshift.runs import redis_client

    given = _switch_request(dict(conf or {}))
    client = redis_client(settings)
    run = _switch_target(settings, client, given)
    strategy_from, partitions_from = run.strategy, run.partitions or None
    stale = skip_reason(run, run.run_id, given.strategy_from, given.partitions_from)
    if stale:
        from keyshift.errors import SwitchSkipped

        raise SwitchSkipped(f"stale switch request: {stale} (decided at {given.decided_at}); "
                            f"the monitor's next evaluation decides again")
    if run.topic and run.topic != given.topic:
        log.info("run %s reads %r, not %r: switching it on its own topic", run.run_id, run.topic, given.topic)
    request = _switch_request({
        **given.model_dump(), "run_id": run.run_id, "topic": run.topic or given.topic, "strategy_from": strategy_from,
        "partitions_from": partitions_from, "partitions": given.partitions or partitions_from,
        "decided_at": given.decided_at or datetime.now(timezone.utc),
    })
    record = {
        **request.model_dump(mode="json"), "dag_run_id": dag_run_id, "accepted_at": datetime.now(timezone.utc).isoformat(),
        "state": "requested", "switch_record_key": names.redis_switch_record_key(request.run_id),
    }
    key = names.redis_switch_requests_key(request.topic)
    with client.pipeline(transaction=True) as pipe:
        pipe.lpush(key, json.dumps(record, sort_keys=True))
        pipe.ltrim(key, 0, SWITCH_REQUESTS_KEPT - 1)
        pipe.execute()
    gain = f", expected gain {request.expected_gain_s:.2f} s" if request.expected_gain_s is not None else ""
    log.info("switch of run %s on %r requested: %s/P=%d -> %s/P=%d (%s%s): %s; recorded in %s", request.run_id, request.topic,
             request.strategy_from, request.partitions_from, request.strategy, request.partitions, request.trigger, gain,
             request.reason, key)
    return record
