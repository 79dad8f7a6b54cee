"""The keyed window engine's key-window path: sliding windows of a job spec computed with key windows.

A spec with `window="key_windows"` (`keyshift.jobs.spec.JobSpec`; paper 003) takes this path
after the shared front of `keyshift.processing.job_query.job_stream` (parse and
validate, this run's records, plausibility, watermark, markers dropped):

    events -> slot token per row (mapInPandas: the placement Local Merge uses, no pre-aggregation)
    -> groupBy(token).transformWithStateInPandas(KeyWindowProcessor, dead letters passed through)

There is no Local Merge: a key window update needs each event's time and value, so rows cross
the shuffle one per event (partials per (key, slide) would merge events that enter and leave
together, a possible later optimisation). Dead letters go to slot `kafka_partition mod P`, as
Local Merge sends them. Output rows: `keyshift.processing.operators.key_window_processor.key_window_output_schema`
with the dead-letter columns; `keyshift.processing.outputs.key_window_sink.KeyWindowSink` routes them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from keyshift.errors import ConfigurationError
from keyshift.eventtime.key_windows import SlidingWindow
from keyshift.eventtime.watermarks import WatermarkPolicy
from keyshift.placement.spark_tokens import assignment_token_lookup, token_lookup
from keyshift.placement.tokens import slot_tokens
from keyshift.processing.operators.key_window_processor import DEAD_LETTER_COLUMNS, KeyWindowColumns, KeyWindowProcessor
from keyshift.jobs.spec import JobSpec


def key_window_columns(spec: JobSpec) -> KeyWindowColumns:
    """The processor's column names for `spec`: its key, `event_time_ms`, its value field (the
    one long field summed and maxed), `event_id`, `kafka_partition`, `kafka_offset`, `token`,
    with dead letters passed through.

    Raises:
        ConfigurationError: `spec` is not a key-window spec.
    """
    return KeyWindowColumns(key=spec.key, event_time_ms=spec.event_time, value=spec.value_field, event_id=spec.event_id,
                            partition="kafka_partition", offset="kafka_offset", dead_letters=True)


def key_window_input_schema(spec: JobSpec) -> T.StructType:
    """Rows the processor receives: token (int), key (string), event_time_ms, value, event_id
    (long), kafka_partition (int), kafka_offset (long), the dead-letter columns (strings). One
    row per event or dead letter."""
    c = key_window_columns(spec)
    return T.StructType([
        T.StructField(c.token, T.IntegerType(), False),
        T.StructField(c.key, T.StringType(), True),
        T.StructField(c.event_time_ms, T.LongType(), True),
        T.StructField(c.value, T.LongType(), True),
        T.StructField(c.event_id, T.LongType(), True),
        T.StructField(c.partition, T.IntegerType(), True),
        T.StructField(c.offset, T.LongType(), True),
        *[T.StructField(name, T.StringType(), True) for name in DEAD_LETTER_COLUMNS],
    ])


def tokens_of_rows(rows: pd.DataFrame, key: str, token_of, tokens: np.ndarray) -> np.ndarray:
    """The slot token of each row (int32, shape (len(rows),)): `token_of(key)` for an event, and
    `tokens[kafka_partition mod P]` for a dead letter (`dead_letter_reason` set)."""
    rejected = rows["dead_letter_reason"].notna().to_numpy()
    out = tokens[rows["kafka_partition"].to_numpy(np.int64) % len(tokens)].astype(np.int32)
    if (~rejected).any():
        codes, names = pd.factorize(rows[key].to_numpy(object)[~rejected])
        out[~rejected] = np.array([token_of(name) for name in names], dtype=np.int32)[codes]
    return out


def key_window_input_function(spec: JobSpec, strategy_name: str, partitions: int, assignment: dict[str, int] | None = None,
                              store: tuple[str, str] | None = None, stateful_partitions: int | None = None):
    """The `mapInPandas` function: a Spark partition of parsed records -> `key_window_input_schema`
    rows with their slot tokens, placed as Local Merge places them (`strategy_name`'s rule, or a
    learned `assignment` with `store` = (redis_url, assignment name) for keys it lacks), steered
    to S = `stateful_partitions` stateful partitions (None: S = P)."""
    schema = key_window_input_schema(spec)
    c = key_window_columns(spec)

    def place(chunks: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        if assignment is not None:
            token_of, tokens = assignment_token_lookup(assignment, partitions, *store, stateful_partitions)
        else:
            token_of, tokens = token_lookup(strategy_name, partitions, stateful_partitions)
        for chunk in chunks:
            if not len(chunk):
                continue
            out = pd.DataFrame({name: chunk[name] for name in schema.fieldNames() if name != c.token})
            out.insert(0, c.token, tokens_of_rows(chunk, spec.key, token_of, tokens))
            yield out[schema.fieldNames()]

    return place


def check_key_window_run(spec: JobSpec, split: Mapping[str, Sequence[int]] | None, policy: WatermarkPolicy) -> None:
    """Refuse what key windows cannot do in a run.

    Raises:
        ConfigurationError: split keys (hot_split: the pieces' updates do not merge), or the
            `timeout` idle fallback (`KeyWindowProcessor` supports `global` only).
    """
    if split:
        raise ConfigurationError(f"job {spec.name}: key windows cannot run split keys ({', '.join(sorted(split))}): "
                                 "the updates of a key's pieces do not merge; use a strategy without hot_split")
    if policy.idle_fallback != "global":
        raise ConfigurationError(f"job {spec.name}: key windows support --idle-fallback global only, got {policy.idle_fallback!r}")


def key_window_stream(events: DataFrame, spec: JobSpec, strategy: str, partitions: int, window_ms: int, policy: WatermarkPolicy,
                      assignment: dict[str, int] | None = None, store: tuple[str, str] | None = None,
                      watermark_floor_ms: int = 0, initial_state=None, stateful_partitions: int | None = None) -> DataFrame:
    """Slot tokens -> groupBy(token).transformWithStateInPandas(KeyWindowProcessor).

    Args:
        events: parsed records after the watermark (no event-time timestamp column, no markers),
            with `keyshift.processing.operators.local_merge.input_columns(spec)`; dead letters included.
        spec: a key-window job spec. strategy, partitions, assignment, store: placement as in
            `key_window_input_function`. window_ms: the window size p (ms of event time); the
            slide s is `spec.slide_ms`. policy: the watermark policy (the query's `withWatermark`
            delay must be `policy.spark_delay_ms`). watermark_floor_ms: see `KeyWindowProcessor`.
        initial_state: migrated state (a switch), or None.
        stateful_partitions: S, the query's `spark.sql.shuffle.partitions` (None: S = P).

    Returns:
        A streaming DataFrame of `key_window_output_schema(key_window_columns(spec))` rows, append mode.

    Raises:
        ConfigurationError: `spec` is not a key-window spec, or p is not a multiple of s.
    """
    columns = key_window_columns(spec)
    processor = KeyWindowProcessor(slot_tokens(partitions, stateful_partitions), SlidingWindow(window_ms, spec.slide_ms), policy, columns,
                                   watermark_floor_ms)
    placed = events.mapInPandas(key_window_input_function(spec, strategy, partitions, assignment, store, stateful_partitions),
                                key_window_input_schema(spec))
    return placed.groupBy(columns.token).transformWithStateInPandas(
        statefulProcessor=processor, outputStructType=processor.output_schema, outputMode="Append", timeMode="EventTime",
        initialState=initial_state,
    )
