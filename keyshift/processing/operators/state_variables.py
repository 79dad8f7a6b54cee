"""A stateful operator's declared state and how it takes migrated state in: the engine's side of a switch.

A keyed stateful operator (`keyshift.processing.operators.processor`, `key_window_processor`) declares the
state it keeps per real key (`MapStateVariable`: a MapState keyed by the job's real key, e.g. the
origin, inside a `transformWithStateInPandas` grouped by slot token, DESIGN.md). A switch
(`keyshift.migration.state`) reads those variables from the old query's checkpoint, re-keys them
and saves them as initial-state rows (`initial_state_schema`); the next query reads them
(`initial_state_frame`) and its `handleInitialState` puts each token's rows back
(`restore_initial_state`). Spark's own contract: `transformWithStateInPandas(initialState=...)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from keyshift.deferred_import import deferred_module

pd = deferred_module("pandas")  # not imported by the pre-init process (keyshift.deferred_import)

STATE_VAR_COLUMN = "state_var"
"""Column of the initial-state rows naming the state variable a row restores."""
TIMER_VAR = "__timers__"
"""`state_var` of rows that carry a registered event-time timer (`expiry_ms`) instead of state."""
EXPIRY_COLUMN = "expiry_ms"
GROUPING_COLUMN = "token"
"""The grouping column of every keyshift stateful query: the slot token (int)."""


@dataclass(frozen=True)
class MapStateVariable:
    """A MapState a job keeps per real key, declared so a switch can move it.

    Attributes:
        name: the state variable's name (`handle.getMapState(name, ...)`).
        key_schema: the map key's schema: one string field holding the real key (e.g. origin).
        value_schema: the map value's schema (every field is carried as it is).
        merge: folds the values of one real key found on several old slots into one (a tuple of
            value fields per slot -> one tuple), for keys that were split; None: such a key is an
            error (JobError), since its pieces cannot be combined.
        broadcast: map keys that are not real keys but per-slot entries every slot may need
            (e.g. an nkey watermark group `#17`): such an entry is merged over its old slots and
            written to every new slot. None: every map key is a real key placed by the plan.
    """

    name: str
    key_schema: T.StructType
    value_schema: T.StructType
    merge: Callable[[list[tuple]], tuple] | None = None
    broadcast: Callable[[str], bool] | None = None

    @property
    def key_field(self) -> str:
        """The map key's one field, the real key."""
        return self.key_schema.fields[0].name

    @property
    def value_fields(self) -> list[str]:
        """The names of the map value's fields, in schema order."""
        return [f.name for f in self.value_schema.fields]


def initial_state_schema(variables: Sequence[MapStateVariable]) -> T.StructType:
    """Schema of the initial-state rows: token, state_var, the real key (`key`), every declared
    value field (NULL where a variable lacks it) and `expiry_ms` for timer rows."""
    fields = [T.StructField(GROUPING_COLUMN, T.IntegerType(), False), T.StructField(STATE_VAR_COLUMN, T.StringType(), False),
              T.StructField("key", T.StringType(), True)]
    seen = {"key"}
    for variable in variables:
        for f in variable.value_schema.fields:
            if f.name not in seen:
                fields.append(T.StructField(f.name, f.dataType, True))
                seen.add(f.name)
    fields.append(T.StructField(EXPIRY_COLUMN, T.LongType(), True))
    return T.StructType(fields)


def initial_state_frame(spark: SparkSession, path: Path, variables: Sequence[MapStateVariable]) -> DataFrame:
    """The saved initial-state rows as a Spark DataFrame grouped by token, for
    `transformWithStateInPandas(initialState=...)`."""
    rows = pd.read_parquet(path)
    schema = initial_state_schema(variables)
    longs = [isinstance(f.dataType, (T.LongType, T.IntegerType)) for f in schema.fields]

    def plain(value, is_long: bool):
        """A value Spark accepts for its field: None for NULL (pandas NA or NaN), int for a long
        (a long NULL in other rows reads back as float or Int64), the value otherwise."""
        if value is None or (not isinstance(value, (bytes, str)) and pd.isna(value)):
            return None
        return int(value) if is_long else value

    records = [tuple(plain(v, is_long) for v, is_long in zip(row, longs)) for row in rows[schema.fieldNames()].itertuples(index=False)]
    return spark.createDataFrame(records, schema).groupBy(GROUPING_COLUMN)


def restore_initial_state(frame: pd.DataFrame, states: Mapping[str, Any], register_timer: Callable[[int], None],
                          variables: Sequence[MapStateVariable]) -> None:
    """Put one token's initial-state rows back (call from `handleInitialState`).

    Args:
        frame: rows of `initial_state_schema` for the current grouping key.
        states: variable name -> the processor's MapState handle.
        register_timer: the handle's `registerTimer` (event-time ms).
    """
    by_name = {v.name: v for v in variables}
    for name, rows in frame.groupby(STATE_VAR_COLUMN, sort=False):
        if name == TIMER_VAR:
            for expiry in rows[EXPIRY_COLUMN].dropna().astype(np.int64):
                register_timer(int(expiry))
            continue
        variable = by_name[name]
        # a long field of one variable is NULL in another's rows, so pandas hands it over as float
        as_int = {f.name for f in variable.value_schema.fields if isinstance(f.dataType, (T.LongType, T.IntegerType))}
        for row in rows.itertuples(index=False):
            value = tuple(int(getattr(row, f)) if f in as_int else getattr(row, f) for f in variable.value_fields)
            states[name].updateValue((getattr(row, "key"),), value)
