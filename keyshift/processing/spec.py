"""The job spec: what one keyed window job computes, and nothing about how.

keyshift's keyed window engine (parse and validate -> Local Merge -> stateful processor -> sinks,
with placement, watermark modes, dead letters, late output, per-slot metrics and migratable
state) is written once; a job is a `JobSpec`: its record fields and their validation, the key,
the event time, associative aggregates over a window, and an output rule that derives the
window's published columns (e.g. the flights' mean delay and alert). A job file is then a spec
of a few dozen lines (`keyshift.jobs.flight_delays`).

The window (`JobSpec.window`) is one of `WINDOWS`:
- `tumbling` (the default): windows [k·p, (k+1)·p) per key, p = `window_ms`; Local Merge and
  `keyshift.processing.processor.KeyedWindowProcessor`; the windows table.
- `key_windows`: sliding windows of size p = `window_ms` and slide s = `slide_ms` per key,
  computed with key windows (paper 003, Cheng 2023, §4; `keyshift.eventtime.key_windows`): one
  update per change of a key's result, at most 2n for n events instead of up to p·n/s windows;
  `keyshift.processing.key_window_processor.KeyWindowProcessor`; the key_windows table. That
  processor computes count, sum and max of ONE long field, so such a spec's aggregates are sum
  and/or max of one long field, and it publishes no derived outputs and no alerts.

Column conventions the engine relies on: every job has an `event_id` (a non-negative long that
identifies an event: duplicates are dropped by it) and an event time in epoch milliseconds UTC;
the key is a string and the Kafka key must equal its UTF-8 bytes (placement relies on it).
Aggregates are over long fields and must be associative and commutative (sum, max, min; count is
always computed), so partials merge in any order: before the shuffle (Local Merge), across
micro-batches, across the pieces of a split key, and across a switch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from pyspark.sql import types as T

from keyshift.errors import ConfigurationError
from keyshift.eventtime.windows import HOUR_MS

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
        return AGGREGATE_OPS[self.op][1]


@dataclass(frozen=True)
class JobTopics:
    """The job's Kafka topics: input, and the side outputs for alerts, late events, dead letters."""

    input: str
    alerts: str
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

    Raises:
        ConfigurationError: a field, aggregate or column the spec names is missing or mistyped;
            an unknown window; a `key_windows` spec without a valid slide, with aggregates other
            than sum and/or max of one long field, or with derived outputs or an alert; a
            tumbling spec with a slide.
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
    event_time: str = field(default="event_time_ms", init=False)
    event_id: str = field(default="event_id", init=False)

    def __post_init__(self) -> None:
        by_col = {f.col: f for f in self.fields}
        for column, dtype in ((self.key, "string"), (self.event_id, "long"), (self.event_time, "long")):
            if column not in by_col or by_col[column].dtype != dtype:
                raise ConfigurationError(f"job {self.name}: needs a {dtype} field with column {column!r}")
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
    def payload(self) -> tuple[RecordField, ...]:
        """Fields carried per event through Local Merge for late and duplicate rows: all but the
        key, the event id and the event time (which the engine carries itself)."""
        return tuple(f for f in self.fields if f.col not in (self.key, self.event_id, self.event_time))

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
        return tuple(a.name for a in self.aggregates)

    def window_values(self, counts: np.ndarray, aggregates: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """count, the aggregates and the derived outputs of windows (the output rule applied)."""
        values = {"count": np.asarray(counts, np.int64), **{k: np.asarray(v, np.int64) for k, v in aggregates.items()}}
        values.update({k: np.asarray(v) for k, v in self.derive(values["count"], aggregates).items()})
        return values
