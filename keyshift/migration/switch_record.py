"""The switch record: what one switch of a run asked for and what each of its steps did, typed.

One record per switch, kept in Redis by `keyshift.migration.switch.SwitchControl` (the current
one under `names.redis_switch_record_key(run_id)`, finished ones pushed on the run's history
list) as JSON whose keys are this class's attributes. `SwitchControl` is the one place that
reads and writes it; the driver's steps (`keyshift.migration.in_driver`), the requester
(`request_switch`), the Airflow tasks, the CLI, the bench and the keyshift page get a
`SwitchRecord`.

The steps and what each records are in `keyshift.migration.switch`'s table (paper 000 §4.2.3).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from keyshift.errors import ConfigurationError


@dataclass
class SwitchRecord:
    """One switch of a run, step by step. Mutable: the steps fill it in; `SwitchControl.save`
    stores it.

    Attributes:
        switch_id: `sw-<UTC time>-<4 hex>`. run_id: the run it moves. topic: the run's input.
        reason: why it was asked (the monitor's decision, or the user's words).
        requested_at: epoch seconds of the request.
        strategy_from, partitions_from, epoch_from: the placement in force before (P slots).
        strategy_to, partitions_to, epoch_to: the placement after.
        mapping: the new assignment, key -> slot (a learned strategy's; {} for a rule).
        split: the new split keys -> slots. mapping_from, split_from: the old ones (a rollback
            republishes them).
        plan: the plan's record (`keyshift.migration.plan.SwitchPlan.as_record`).
        sampled_events: events the plan sampled from the topic.
        in_driver: whether the run's driver carries the switch out (False once a requester
            relaunched a dead driver to finish it).
        step: the last step completed (`keyshift.migration.switch.STEPS`).
        state: requested | running | done | failed | rolled_back.
        step_seconds: step -> seconds it took (also `start_query`, `first_batch`).
        updated_at: epoch seconds of the last save.
        stop_requested_at: epoch seconds when the old query stopped taking batches: the pause
            starts there. With a state handover, the barrier batch's commit (the query processed
            events until then); without, when the driver closed the sink's barrier (the batch in
            the sink then still finishes, inside the pause).
        barrier_requested_at: epoch seconds when the driver asked for a barrier batch (the
            handover); its step `barrier_batch` (request to the barrier batch's commit, or to
            the stop when no batch came for it) is outside the pause: the old query processes
            events meanwhile.
        state_source: where the migrated state came from: `handover` (the barrier batch's
            snapshot, `keyshift.processing.outputs.handover`) or `checkpoint` (Spark's state
            data source on the old checkpoint, when no complete snapshot exists).
        cut_batch: the old query's last committed batch (its query batch id; None: it committed
            none). cut_offsets: partition (text) -> Kafka offset the new query starts at.
        watermark_floor_ms: ms of event time the new query's watermark starts from.
        batch_base: the run-wide id of the new query's batch 0. old_checkpoint: the old query's
            checkpoint folder (under the run). new_checkpoint: the new query's.
        migration: the migrated state's summary (`MigratedState.summary`).
        published_at, query_started_at: epoch seconds.
        keys_added_to_plan: keys with state but not in the plan's sample, placed by
            `complete_mapping`.
        verify: what the verify step found (`placement`, `conservation`).
        pause_seconds: from the old query's last commit (its barrier batch's, or the stop request without one) to the new query's first commit, seconds
            (both commits as Spark wrote them).
        error: why it failed or was rolled back. finished_at: epoch seconds of its end.
    """

    switch_id: str
    run_id: str
    topic: str
    strategy_from: str
    strategy_to: str
    partitions_from: int
    partitions_to: int
    epoch_from: int
    epoch_to: int
    reason: str = ""
    requested_at: float | None = None
    mapping: dict[str, int] = field(default_factory=dict)
    split: dict[str, list[int]] = field(default_factory=dict)
    mapping_from: dict[str, int] = field(default_factory=dict)
    split_from: dict[str, list[int]] = field(default_factory=dict)
    plan: dict[str, Any] | None = None
    sampled_events: int | None = None
    in_driver: bool = True
    step: str = "requested"
    state: str = "requested"
    step_seconds: dict[str, float] = field(default_factory=dict)
    updated_at: float | None = None
    stop_requested_at: float | None = None
    barrier_requested_at: float | None = None
    state_source: str | None = None
    cut_batch: int | None = None
    cut_offsets: dict[str, int] | None = None
    watermark_floor_ms: int | None = None
    batch_base: int | None = None
    old_checkpoint: str | None = None
    new_checkpoint: str | None = None
    migration: dict[str, Any] | None = None
    published_at: float | None = None
    query_started_at: float | None = None
    keys_added_to_plan: int | None = None
    verify: dict[str, Any] | None = None
    pause_seconds: float | None = None
    error: str | None = None
    finished_at: float | None = None

    @classmethod
    def field_names(cls) -> frozenset[str]:
        """The names a switch record holds."""
        return frozenset(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "SwitchRecord":
        """A record from its stored JSON object; keys this version does not know are ignored.

        Raises:
            ConfigurationError: a required key (the request's) is missing.
        """
        known = cls.field_names()
        try:
            return cls(**{k: v for k, v in raw.items() if k in known})
        except TypeError as exc:
            raise ConfigurationError(f"a switch record lacks a field ({exc}): {dict(raw)}") from exc

    def as_json(self) -> dict[str, Any]:
        """The record as stored: every attribute (JSON types only)."""
        return dataclasses.asdict(self)

    def update(self, **values: Any) -> "SwitchRecord":
        """Set attributes by name; returns the record.

        Raises:
            ValueError: a name that is not a field of the switch record.
        """
        unknown = set(values) - self.field_names()
        if unknown:
            raise ValueError(f"not fields of a switch record: {sorted(unknown)}")
        for name, value in values.items():
            setattr(self, name, value)
        return self

    @property
    def rule_strategy(self) -> bool:
        """Whether the new strategy is a rule (hash, modulo) that places every key itself."""
        return self.strategy_to in ("hash", "modulo")

    @property
    def split_slots(self) -> dict[str, tuple[int, ...]]:
        """The new split keys -> slots as tuples."""
        return {k: tuple(v) for k, v in (self.split or {}).items()}

    @property
    def split_from_slots(self) -> dict[str, tuple[int, ...]]:
        """The old split keys -> slots as tuples."""
        return {k: tuple(v) for k, v in (self.split_from or {}).items()}
