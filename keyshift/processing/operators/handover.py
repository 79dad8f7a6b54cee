"""The state handover at a switch's barrier batch, executor side.

A switch cuts the run after one micro-batch of the old query, the barrier batch (paper 000
§4.2.3; `keyshift.migration.switch`). Instead of reading the old query's state back from its
checkpoint with Spark's state data source after the query stopped (three Spark jobs, each
opening every stateful partition's RocksDB store: 0.8 to 1.7 s of the switch's pause on this
project's 2-core machines), the old query hands its state over itself, in the barrier batch:

1. The driver marks the barrier batch with the local property `HANDOVER_PROPERTY` (set on the
   thread that runs the batch's job in `foreachBatch`, so every task of that job, and no other,
   sees it: `TaskContext.getLocalProperty`).
2. Every ingest task of that batch adds one barrier row per slot token (`barrier_rows`: count 0,
   no key), so that every token's `handleInputRows` runs in the barrier batch even if none of
   the batch's events is placed on it, as a Flink checkpoint barrier reaches every subtask.
3. Each token's processor, after processing the batch's rows (and again after each timer pass
   of that batch: Spark runs the expired timers after the input), emits a snapshot of its state
   (`snapshot_rows`): one `state` row per MapState entry and per registered timer, and one
   `handover` row with the number of `state` rows, all stamped with one sequence number that
   grows within the task (`time.monotonic_ns`). The driver keeps each token's latest snapshot
   (`keyshift.processing.outputs.handover`).

The processor drops barrier rows before anything else (`drop_barrier_rows`): they carry no event.
Outside a barrier batch none of this runs; a barrier batch costs one MapState listing and one
`listTimers` per token.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from keyshift.deferred_import import deferred_module
from keyshift.processing.operators.output_rows import OutputRows

pd = deferred_module("pandas")  # not imported by the pre-init process (keyshift.deferred_import)
pa = deferred_module("pyarrow")

HANDOVER_PROPERTY = "keyshift.switch.handover"
"""Spark local property set to "1" on the barrier batch's job (the driver's `foreachBatch`)."""
KIND_STATE = "state"
"""Output kind of one state entry (a MapState key and value, or a timer) of a snapshot."""
KIND_HANDOVER = "handover"
"""Output kind of a snapshot's header: `count` state rows follow under the same `handover_seq`."""
TIMERS = "__timers__"
"""`state_variable` of a snapshot's timer rows (the value is the 1-tuple (expiry ms,))."""
STATE_COLUMNS = ("state_variable", "state_value", "handover_seq")
"""The output columns only snapshot rows use (`keyshift.processing.operators.processor.output_schema`)."""


def handover_requested() -> bool:
    """True inside a task of the barrier batch's job (`HANDOVER_PROPERTY` set); False elsewhere,
    and outside a Spark task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context is not None and context.getLocalProperty(HANDOVER_PROPERTY) == "1"


def barrier_rows(schema: "pa.Schema", tokens: Sequence[int], control_column: str) -> "pa.Table":
    """One barrier row per slot token in an ingest stage's `schema` (Local Merge's partials plus
    the stage's event-time and control columns): `token` set, `count` 0, the control flag False
    (no end-of-input marker), every other column NULL, the event time included (so the rows pass
    the watermark operator and its marker filter without moving the watermark).

    Args:
        schema: the ingest stage's Arrow schema; it must have `token`, `count` and `control_column`.
        tokens: the slot tokens in force (`keyshift.placement.tokens.slot_tokens`).
        control_column: the stage's end-of-input marker flag.

    Returns:
        A table of len(tokens) rows.
    """
    n = len(tokens)
    arrays = {field.name: pa.nulls(n, field.type) for field in schema}
    arrays["token"] = pa.array(np.asarray(tokens, np.int32))
    arrays["count"] = pa.array(np.zeros(n, np.int64))
    arrays[control_column] = pa.array(np.zeros(n, bool))
    return pa.Table.from_arrays([arrays[f.name].cast(f.type) for f in schema], schema=schema)


def drop_barrier_rows(chunks: Iterable["pd.DataFrame"]) -> Iterator["pd.DataFrame"]:
    """The processor's input chunks without barrier rows (`count` 0: every partial and dead
    letter counts at least one event)."""
    for chunk in chunks:
        counts = chunk["count"].to_numpy()
        if len(counts) and not counts.all():
            chunk = chunk[counts != 0]
        yield chunk


def snapshot_rows(slot: int, partition_id: int, key_column: str, maps: Sequence[tuple[str, Any]],
                  timers: Iterable[int]) -> Iterator[OutputRows]:
    """One slot token's state as output rows (module docstring, step 3).

    Args:
        slot: the token's slot (its index in the query's slot tokens).
        partition_id: the Spark partition (the stateful partition holding the token's state).
        key_column: the spec's key column, which carries each entry's map key.
        maps: (variable name, its `MapState`) for every declared state variable.
        timers: the token's registered timers (ms of event time).

    Returns:
        The `state` rows (value: the pickled value tuple) and then the `handover` row.
    """
    keys: list[Any] = []
    names: list[str] = []
    values: list[bytes] = []
    for name, state in maps:
        for (key, *_), value in state.iterator():
            keys.append(key)
            names.append(name)
            values.append(pickle.dumps(tuple(value), protocol=pickle.HIGHEST_PROTOCOL))
    for expiry in timers:
        keys.append(None)
        names.append(TIMERS)
        values.append(pickle.dumps((int(expiry),), protocol=pickle.HIGHEST_PROTOCOL))
    n, seq = len(keys), time.monotonic_ns()
    if n:
        yield OutputRows(KIND_STATE, n, {"slot": [slot] * n, "partition_id": [partition_id] * n, key_column: keys,
                                         "state_variable": names, "state_value": values, "handover_seq": [seq] * n})
    yield OutputRows(KIND_HANDOVER, 1, {"slot": [slot], "partition_id": [partition_id], "count": [n], "handover_seq": [seq]})
