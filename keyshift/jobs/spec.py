"""The job spec: what one keyed window job computes, and nothing about how.

keyshift's keyed window engine (parse and validate -> Local Merge -> stateful processor -> sinks,
with placement, watermark modes, dead letters, late output, per-slot metrics and migratable
state) is written once; a job is a `JobSpec`: its record fields and their validation, the key,
the event time, associative aggregates over a window, and an output rule that derives the
window's published columns (e.g. the flights' mean delay and alert). A job file is then a spec
of a few dozen lines (`keyshift.jobs.flight_delays`).

The window (`JobSpec.window`) is one of `WINDOWS`:
- `tumbling` (the default): windows [k·p, (k+1)·p) per key, p = `window_ms`; Local Merge and
  `keyshift.processing.operators.processor.KeyedWindowProcessor`; the windows table.
- `key_windows`: sliding windows of size p = `window_ms` and slide s = `slide_ms` per key,
  computed with key windows (paper 003, Cheng 2023, §4; `keyshift.eventtime.key_windows`): one
  update per change of a key's result, at most 2n for n events instead of up to p·n/s windows;
  `keyshift.processing.operators.key_window_processor.KeyWindowProcessor`; the key_windows table. That
  processor computes count, sum and max of ONE long field, so such a spec's aggregates are sum
  and/or max of one long field, and it publishes no derived outputs and no alerts.

Column conventions the engine relies on: every job has an `event_id` (a non-negative long that
identifies an event: duplicates are dropped by it) and an event time in epoch milliseconds UTC;
the key is a string and the Kafka key must equal its UTF-8 bytes (placement relies on it).
Aggregates are over long fields and must be associative and commutative (sum, max, min; count is
always computed), so partials merge in any order: before the shuffle (Local Merge), across
micro-batches, across the pieces of a split key, and across a switch.

Two options serve jobs whose records need more than validation (the Yahoo Streaming Benchmark,
`keyshift.jobs.ysb`):
- `keep` (`Keep`): only records whose string field is one of some values are the job's events;
  a valid record that does not match is `filtered`: neither an event nor a dead letter, counted
  so that events read = Σ window counts + late + dead letters + filtered + pending.
- `key_lookup` (`KeyLookup`): the key is not in the record but looked up from one of its fields
  in a map kept in Redis (YSB: ad_id -> campaign_id), executor-side in Local Merge
  (`keyshift.processing.operators.key_lookup`); the Kafka key must equal the looked-up key.
`carry` limits the fields carried past validation (YSB projects ad_id and the event time), and
`redis_windows` makes the sink also write each final window to Redis as the published benchmark
does (`keyshift.processing.outputs.redis_windows`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from pyspark.sql import types as T

from keyshift.deferred_import import deferred_module
from keyshift.errors import ConfigurationError
from keyshift.eventtime.windows import HOUR_MS

pa = deferred_module("pyarrow")  # not imported by transformWithState's pre-init process (keyshift.deferred_import)

SPARK_TYPES = {"long": T.LongType(), "string": T.StringType(), "double": T.DoubleType(), "boolean": T.BooleanType()}
"""The type names a spec uses, and their Spark types."""

AGGREGATE_OPS: dict[str, tuple[np.ufunc, int]] = {
    "sum": (np.add, 0),
    "max": (np.maximum, np.iinfo(np.int64).min),
    "min": (np.minimum, np.iinfo(np.int64).max),
}
"""Associative aggregate -> (numpy ufunc that merges two partials, its identity)."""

WINDOWS = ("tumbling", "key_windows")
"""The windows a spec can choose (module docstring)."""

KEY_WINDOW_OPS = ("sum", "max")
"""The aggregates key windows compute (besides count), of one long field."""


@dataclass(frozen=True)
class RecordField:
    """One field of a job's JSON record.

    Attributes:
        name: the JSON field name.
        dtype: `long` (a JSON integer in the 64-bit range) or `string`.
        column: the engine's column for it (default: `name`), e.g. `event_time` -> `event_time_ms`.
        non_negative: a negative value is a dead letter (`negative <name>`); longs only.
        non_empty: an empty or blank string is a dead letter (`empty <name>`), and so is one over
            `MAX_CODE_BYTES` UTF-8 bytes (`<name> over N bytes`); strings only.
    """

    name: str
    dtype: str
    column: str | None = None
    non_negative: bool = False
    non_empty: bool = False

    @property
    def col(self) -> str:
        """The engine's column name of this field."""
        return self.column or self.name

    @property
    def spark_type(self) -> T.DataType:
        """The field's Spark SQL type (`SPARK_TYPES` of its dtype: string or long)."""
        return SPARK_TYPES[self.dtype]


@dataclass(frozen=True)
class Aggregate:
    """An associative aggregate of a window: `op` (sum, max, min) of long column `field`,
    published as column `name`."""

    name: str
    op: str
    field: str

    @property
    def merge(self) -> np.ufunc:
        """The numpy ufunc that merges two partials of this aggregate."""
        return AGGREGATE_OPS[self.op][0]

    @property
    def identity(self) -> int:
        """The aggregate's identity element (0 for sum; the long extremes for max and min): the
        partial of a window with no event."""
        return AGGREGATE_OPS[self.op][1]


@dataclass(frozen=True)
class Keep:
    """Keep only the records whose string field `field` equals one of `values` (YSB:
    `Keep("event_type", ("view",))`); the other valid records are `filtered` (module docstring)."""

    field: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class KeyLookup:
    """The key of a record is looked up from its string field `field` in a Redis hash.

    Attributes:
        field: the record's field whose value is looked up (YSB: `ad_id`).
        map_key: input topic -> name of the Redis hash field value -> key (YSB:
            `keyshift.names.redis_ysb_ad_campaign_key`).
        version_key: input topic -> name of a Redis counter its writer increments with every new
            map, so executors reload their cached copy only when it changed.

    A record whose value is not in the map is a dead letter `unknown <field>`
    (`missing_reason`); one whose Kafka key differs from the looked-up key is a dead letter
    `key does not match <key>` (`keyshift.processing.operators.records.key_mismatch`).
    """

    field: str
    map_key: Callable[[str], str]
    version_key: Callable[[str], str]

    @property
    def missing_reason(self) -> str:
        """The dead-letter reason of a record whose `field` value is not in the map."""
        return f"unknown {self.field}"


@dataclass(frozen=True)
class JobTopics:
    """The job's Kafka topics: input, and the side outputs for alerts (None: a job without
    alerts), late events, dead letters."""

    input: str
    alerts: str | None
    late: str
    dead_letter: str


@dataclass(frozen=True)
class JobSpec:
    """A keyed window job (module docstring).

    Attributes:
        name: the job's name (`keyshift job run NAME`).
        fields: the record's fields, in JSON order; must include the key, `event_id` and the
            event time (column `event_time_ms`).
        key: the key's column (a string field).
        aggregates: the window's aggregates besides `count`.
        outputs: derived window columns -> type name (`double`, `boolean`, `long`, `string`).
        derive: the output rule: (counts: int64 array, aggregates: name -> int64 array) ->
            {output name: array}, one element per window; vectorized.
        table_columns: the order of the windows table's value columns (count, aggregates and
            outputs), after key, window_start, window_end and before slot, epoch.
        alert: the boolean output whose true windows go to the alerts topic (None: no alerts).
        alert_columns: the value columns an alert record carries besides the key, the window
            bounds, the run and the epoch (None: every table column but the alert flag).
        topics: the job's topics.
        window_ms: default window size p, ms of event time (a run may set another).
        window: `tumbling` (default) or `key_windows` (sliding windows of size `window_ms` every
            `slide_ms`, computed with key windows; module docstring).
        slide_ms: key windows only: the slide s, ms of event time (> 0; p must be a multiple of
            it); None for a tumbling window.
        keep: only records matching it are events; the other valid ones are `filtered` (None:
            every valid record is an event).
        key_lookup: the key is looked up in Redis from a field (None: the key is a field).
        carry: the names of the fields carried past validation besides the key, the event id and
            the event time (the payload of late and duplicated events; must include the lookup
            field); None: every field.
        redis_windows: the sink also writes every final window's count and update time to Redis
            (`keyshift.processing.outputs.redis_windows`).

    Raises:
        ConfigurationError: a field, aggregate or column the spec names is missing or mistyped;
            an unknown window; a `key_windows` spec without a valid slide, with aggregates other
            than sum and/or max of one long field, or with derived outputs or an alert; a
            tumbling spec with a slide; a `keep`, `key_lookup` or `carry` naming no string field
            (any field for carry), a key lookup whose key is also a field, a lookup field not
            carried; `keep`, `key_lookup` or `redis_windows` with key windows.
    """

    name: str
    fields: tuple[RecordField, ...]
    key: str
    aggregates: tuple[Aggregate, ...]
    outputs: Mapping[str, str]
    derive: Callable[[np.ndarray, Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]
    table_columns: tuple[str, ...]
    topics: JobTopics
    alert: str | None = None
    alert_columns: tuple[str, ...] | None = None
    window_ms: int = HOUR_MS
    window: str = "tumbling"
    slide_ms: int | None = None
    keep: Keep | None = None
    key_lookup: KeyLookup | None = None
    carry: tuple[str, ...] | None = None
    redis_windows: bool = False
    event_time: str = field(default="event_time_ms", init=False)
    event_id: str = field(default="event_id", init=False)

    def __post_init__(self) -> None:
        by_col = {f.col: f for f in self.fields}
        needed = ((self.event_id, "long"), (self.event_time, "long"))
        for column, dtype in needed if self.key_lookup is not None else ((self.key, "string"), *needed):
            if column not in by_col or by_col[column].dtype != dtype:
                raise ConfigurationError(f"job {self.name}: needs a {dtype} field with column {column!r}")
        self._check_options(by_col)
        for aggregate in self.aggregates:
            if aggregate.op not in AGGREGATE_OPS:
                raise ConfigurationError(f"job {self.name}: unknown aggregate op {aggregate.op!r}; use one of {', '.join(AGGREGATE_OPS)}")
            if by_col.get(aggregate.field) is None or by_col[aggregate.field].dtype != "long":
                raise ConfigurationError(f"job {self.name}: aggregate {aggregate.name} needs a long field {aggregate.field!r}")
        values = {"count", *self.aggregate_names, *self.outputs}
        if set(self.table_columns) != values:
            raise ConfigurationError(f"job {self.name}: table_columns must order exactly {sorted(values)}")
        if self.alert is not None and self.outputs.get(self.alert) != "boolean":
            raise ConfigurationError(f"job {self.name}: alert {self.alert!r} must be a boolean output")
        self._check_window()

    def _check_options(self, by_col: Mapping[str, RecordField]) -> None:
        """`keep`, `key_lookup`, `carry` and `redis_windows` (class docstring, Raises)."""
        by_name = {f.name: f for f in self.fields}
        for option, name in (("keep", self.keep and self.keep.field), ("key_lookup", self.key_lookup and self.key_lookup.field)):
            if name is not None and (name not in by_name or by_name[name].dtype != "string"):
                raise ConfigurationError(f"job {self.name}: {option} needs a string field {name!r}")
        unknown = sorted(set(self.carry or ()) - set(by_name))
        if unknown:
            raise ConfigurationError(f"job {self.name}: carry names fields the record lacks: {unknown}")
        if self.key_lookup is not None:
            if self.key in by_col:
                raise ConfigurationError(f"job {self.name}: a looked-up key {self.key!r} must not also be a record field")
            if by_name[self.key_lookup.field].col not in {f.col for f in self.payload}:
                raise ConfigurationError(f"job {self.name}: carry must include the lookup field {self.key_lookup.field!r}")
        if self.window == "key_windows" and (self.keep or self.key_lookup or self.redis_windows):
            raise ConfigurationError(f"job {self.name}: keep, key_lookup and redis_windows are for tumbling windows")

    def _check_window(self) -> None:
        """The window choice's own rules (class docstring, Raises)."""
        if self.window not in WINDOWS:
            raise ConfigurationError(f"job {self.name}: unknown window {self.window!r}; use one of {', '.join(WINDOWS)}")
        if self.window == "tumbling":
            if self.slide_ms is not None:
                raise ConfigurationError(f"job {self.name}: slide_ms is for window='key_windows'; a tumbling window slides by its size")
            return
        from keyshift.eventtime.key_windows import SlidingWindow

        if self.slide_ms is None:
            raise ConfigurationError(f"job {self.name}: key windows need slide_ms, the slide s in ms of event time")
        SlidingWindow(self.window_ms, self.slide_ms)  # raises for s <= 0 or p not a multiple of s
        ops = [a.op for a in self.aggregates]
        fields = {a.field for a in self.aggregates}
        if not ops or any(op not in KEY_WINDOW_OPS for op in ops) or len(set(ops)) != len(ops) or len(fields) != 1:
            got = ", ".join(f"{a.op}({a.field})" for a in self.aggregates) or "none"
            raise ConfigurationError(
                f"job {self.name}: key windows compute count plus sum and/or max of ONE long field; got aggregates {got}. "
                "Use window='tumbling' for other aggregates"
            )
        if self.outputs or self.alert is not None:
            raise ConfigurationError(
                f"job {self.name}: key windows publish count, sum and max updates only; drop the outputs "
                f"{sorted(self.outputs)} and the alert {self.alert!r}, or use window='tumbling'"
            )

    @property
    def columns(self) -> tuple[str, ...]:
        """The engine's columns of the record's fields, in record order."""
        return tuple(f.col for f in self.fields)

    @property
    def event_time_field(self) -> str:
        """The record's field (its JSON name) that holds the event time (ms)."""
        return next(f.name for f in self.fields if f.col == self.event_time)

    @property
    def payload(self) -> tuple[RecordField, ...]:
        """Fields carried per event through Local Merge for late and duplicate rows: all but the
        key, the event id and the event time (which the engine carries itself), or of those only
        the ones `carry` names."""
        return tuple(f for f in self.fields if f.col not in (self.key, self.event_id, self.event_time)
                     and (self.carry is None or f.name in self.carry))

    @property
    def alert_record_columns(self) -> tuple[str, ...]:
        """The value columns of an alert record (`alert_columns`, or the table's but the flag)."""
        if self.alert_columns is not None:
            return self.alert_columns
        return tuple(c for c in self.table_columns if c != self.alert)

    @property
    def key_windows(self) -> bool:
        """True when the spec computes sliding windows with key windows (`window == "key_windows"`)."""
        return self.window == "key_windows"

    @property
    def value_field(self) -> str:
        """Key windows: the one long field summed and maxed (the column `KeyWindowProcessor`
        reads as its value). Raises ConfigurationError for a tumbling spec."""
        if not self.key_windows:
            raise ConfigurationError(f"job {self.name}: a tumbling window has no single value field")
        return self.aggregates[0].field

    @property
    def aggregate_names(self) -> tuple[str, ...]:
        """The published columns of the spec's aggregates, in declaration order."""
        return tuple(a.name for a in self.aggregates)

    def window_values(self, counts: np.ndarray, aggregates: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """count, the aggregates and the derived outputs of windows (the output rule applied)."""
        values = {"count": np.asarray(counts, np.int64), **{k: np.asarray(v, np.int64) for k, v in aggregates.items()}}
        values.update({k: np.asarray(v) for k, v in self.derive(values["count"], aggregates).items()})
        return values


_ARROW_TYPES = {"long": "int64", "double": "float64", "boolean": "bool_", "string": "string"}
"""A spec's type names -> the pyarrow factory of their Arrow type."""
"""Arrow types of the spec's output types (`JobSpec.outputs` values)."""


def list_column(column: str) -> str:
    """The partial's list column carrying a payload field's value per event
    (`keyshift.processing.operators.local_merge.partial_schema`)."""
    return f"{column}_list"


def window_columns(spec: JobSpec) -> tuple[str, ...]:
    """Columns of the windows table, in order: key, window_start, window_end, the spec's
    `table_columns`, slot, epoch."""
    return (spec.key, "window_start", "window_end", *spec.table_columns, "slot", "epoch")


def window_table_schema(spec: JobSpec) -> pa.Schema:
    """Arrow schema of the windows table (UTC microsecond timestamps for the window bounds)."""
    types = {"count": pa.int64(), **{a: pa.int64() for a in spec.aggregate_names}, **{k: getattr(pa, _ARROW_TYPES[v])() for k, v in spec.outputs.items()}}
    return pa.schema(
        [(spec.key, pa.string()), ("window_start", pa.timestamp("us", tz="UTC")), ("window_end", pa.timestamp("us", tz="UTC"))]
        + [(c, types[c]) for c in spec.table_columns]
        + [("slot", pa.int32()), ("epoch", pa.int64())]
    )
