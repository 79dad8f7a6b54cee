"""Step 4 of a switch: read a stopped query's state, re-key it, hand it to the next query.

Works for any keyed stateful job keyshift runs, not for one processor: the job declares its
state variables (`MapStateVariable`: a MapState keyed by the job's real key, e.g. the origin, inside
a `transformWithStateInPandas` grouped by slot token, DESIGN.md), and this module

1. reads every declared variable of the old checkpoint at its last committed batch with Spark's
   state data source (`spark.read.format("statestore")`, one `stateVarName` per read; MapState
   comes flattened to one row per (grouping key, map key)), and the registered event-time timers
   (`readRegisteredTimers`);
2. re-keys each row: its new grouping key is the token of the slot the new assignment gives its
   real key (a key hot_split spreads over several slots gets all its state on its first piece's
   slot). Rows of one real key that come from several old slots (the pieces of a split key) are
   folded into one with the variable's declared `merge`;
3. moves the timers with the keys: every timer of old token t is registered on each new token
   that receives a key from t (a superset: a timer that finds nothing due emits nothing);
4. builds the `initialState` DataFrame (grouped by token) that `handleInitialState` of the new
   query puts back (`restore_initial_state`), and after the new query's first commit verifies
   that every key's state sits on its assigned slot (the state reader's `partition_id`).

The state is small (a few rows per key: ~230 origins for the flights), so it is re-keyed in
pandas on the driver; Spark's state reader does the reading and the new query the writing.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from keyshift.errors import JobError
from keyshift.processing.operators.state_variables import (  # the engine's side: what operators declare and restore
    EXPIRY_COLUMN, GROUPING_COLUMN, STATE_VAR_COLUMN, TIMER_VAR, MapStateVariable, initial_state_schema,
)

log = logging.getLogger(__name__)

@dataclass
class MigratedState:
    """The re-keyed state of one switch, ready to become the next query's `initialState`.

    Attributes:
        rows: `initial_state_schema` rows (pandas): state and timer rows per new token.
        rows_read: state rows read per variable (one per old grouping key and map key).
        rows_written: state rows per variable after re-keying (fewer when a split key's pieces
            were merged), timers excluded.
        timers_read: registered timers read; `timers_written`: timer rows after moving.
        keys_moved: real keys whose slot changed; `state_bytes`: bytes of every value read;
            `state_bytes_moved`: of the keys that moved.
        slots: real key -> its new slot, for `verify_placement`.
    """

    rows: pd.DataFrame
    rows_read: dict[str, int] = field(default_factory=dict)
    rows_written: dict[str, int] = field(default_factory=dict)
    timers_read: int = 0
    timers_written: int = 0
    keys_moved: int = 0
    keys_total: int = 0
    state_bytes: int = 0
    state_bytes_moved: int = 0
    slots: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON-able counts (rows, timers, keys, bytes)."""
        return {
            "state_rows_read": self.rows_read, "state_rows_written": self.rows_written, "timers_read": self.timers_read,
            "timers_written": self.timers_written, "keys_moved": self.keys_moved, "keys_total": self.keys_total,
            "state_bytes": self.state_bytes, "state_bytes_moved": self.state_bytes_moved,
        }


def _state_reader(spark: SparkSession, checkpoint: Path, batch_id: int | None):
    spark.streams.active  # noqa: B018 - creates the state store coordinator the reader's tasks ask for
    reader = spark.read.format("statestore").option("path", str(checkpoint))
    if batch_id is not None:
        reader = reader.option("batchId", int(batch_id))
    return reader


def read_state(spark: SparkSession, checkpoint: Path, variables: Sequence[MapStateVariable], batch_id: int | None = None
               ) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """Every declared variable and the timers of `checkpoint` at `batch_id` (default: the last
    committed batch), as pandas frames.

    Returns:
        ({variable name: frame of old_token, partition_id, key, value fields...},
         frame of old_token, expiry_ms, partition_id).
    """
    def variable_rows(variable: MapStateVariable) -> pd.DataFrame:
        columns = [f"key.{GROUPING_COLUMN} AS old_token", "partition_id", f"user_map_key.{variable.key_field} AS key"]
        columns += [f"user_map_value.{name} AS {name}" for name in variable.value_fields]
        reader = _state_reader(spark, checkpoint, batch_id).option("stateVarName", variable.name)
        return reader.load().selectExpr(*columns).toPandas()

    def timer_rows() -> pd.DataFrame:
        reader = _state_reader(spark, checkpoint, batch_id).option("readRegisteredTimers", "true")
        return reader.load().selectExpr(f"key.{GROUPING_COLUMN} AS old_token", f"expiration_timestamp_ms AS {EXPIRY_COLUMN}",
                                        "partition_id").toPandas()

    # one Spark job per variable and one for the timers, run side by side (each loads every
    # partition's state store; on few cores they overlap their start-up)
    with ThreadPoolExecutor(max_workers=len(variables) + 1, thread_name_prefix="state-read") as pool:
        frames = {variable.name: pool.submit(variable_rows, variable) for variable in variables}
        timers = pool.submit(timer_rows)
        return {name: future.result() for name, future in frames.items()}, timers.result()


def _value_bytes(frame: pd.DataFrame, fields: Sequence[str]) -> np.ndarray:
    sizes = np.zeros(len(frame), dtype=np.int64)
    for name in fields:
        sizes += np.fromiter((len(v) if isinstance(v, (bytes, bytearray, str)) else 8 for v in frame[name]), np.int64, len(frame))
    return sizes


def rekey_state(
    state: Mapping[str, pd.DataFrame],
    timers: pd.DataFrame,
    variables: Sequence[MapStateVariable],
    slot_of: Callable[[str], int],
    new_tokens: Sequence[int],
    old_tokens: Sequence[int],
) -> MigratedState:
    """Re-key the read state under a new assignment (steps 2-3 of the module docstring).

    Args:
        state, timers: from `read_state`.
        variables: the job's declared state variables.
        slot_of: real key -> its slot under the new assignment (a split key: its first piece's).
        new_tokens: slot -> token of the new query (`slot_tokens(P2, S2)`); `old_tokens` of the old
            query (to tell which keys moved).

    Returns:
        The `MigratedState`.

    Raises:
        JobError: a key is found on several old slots and its variable declares no `merge`.
    """
    slot_of_old_token = {int(t): s for s, t in enumerate(old_tokens)}
    out_frames, migrated = [], MigratedState(rows=pd.DataFrame())
    receivers: dict[int, set[int]] = {}
    for variable in variables:
        frame = state.get(variable.name)
        if frame is None:  # a variable with no rows read (e.g. a job version that did not declare it)
            frame = pd.DataFrame(columns=["old_token", "partition_id", "key", *variable.value_fields])
        migrated.rows_read[variable.name] = len(frame)
        sizes = _value_bytes(frame, variable.value_fields)
        migrated.state_bytes += int(sizes.sum())
        if frame.empty:
            migrated.rows_written[variable.name] = 0
            continue
        shared_rows = 0
        if variable.broadcast is not None:
            is_shared = frame["key"].astype(str).map(variable.broadcast).to_numpy(bool)
            shared, frame, sizes = frame[is_shared], frame[~is_shared], sizes[~is_shared]
            if len(shared):
                out_frames.append(_broadcast_rows(shared, variable, new_tokens))
                shared_rows = len(out_frames[-1])
            if frame.empty:
                migrated.rows_written[variable.name] = shared_rows
                continue
        keys = frame["key"].astype(str).to_numpy(object)
        new_slots = np.array([slot_of(k) for k in keys], dtype=np.int64)
        old_slots = np.array([slot_of_old_token.get(int(t), -1) for t in frame["old_token"]], dtype=np.int64)
        moved = new_slots != old_slots
        migrated.state_bytes_moved += int(sizes[moved].sum())
        for old_token, new_slot in zip(frame["old_token"].to_numpy(np.int64), new_slots):
            receivers.setdefault(int(old_token), set()).add(int(new_tokens[new_slot]))
        for key, slot in zip(keys, new_slots):
            migrated.slots[key] = int(slot)
        rows = frame.assign(**{GROUPING_COLUMN: np.asarray(new_tokens, np.int64)[new_slots].astype(np.int32)})
        duplicated = rows.duplicated("key", keep=False).to_numpy()
        if duplicated.any():
            if variable.merge is None:
                raise JobError(f"state variable {variable.name!r} holds key {keys[duplicated][0]!r} on several slots and declares no merge")
            merged = []
            for key, group in rows[duplicated].groupby("key", sort=False):
                values = variable.merge([tuple(row) for row in group[variable.value_fields].itertuples(index=False)])
                first = group.iloc[0]
                merged.append({"key": key, GROUPING_COLUMN: first[GROUPING_COLUMN], **dict(zip(variable.value_fields, values))})
            rows = pd.concat([rows[~duplicated], pd.DataFrame(merged)], ignore_index=True)
        rows = rows.drop(columns=["old_token", "partition_id"])
        rows[STATE_VAR_COLUMN] = variable.name
        migrated.rows_written[variable.name] = len(rows) + shared_rows
        out_frames.append(rows)
    shared = {v.name: v.broadcast for v in variables if v.broadcast is not None}

    def real_keys(name: str, frame: pd.DataFrame):
        for k, t in zip(frame["key"].astype(str), frame["old_token"]):
            if name not in shared or not shared[name](k):
                yield k, t

    all_keys = {k for name, frame in state.items() for k, _ in real_keys(name, frame)} if state else set()
    migrated.keys_total = len(all_keys)
    migrated.keys_moved = len({
        k for name, frame in state.items() for k, t in real_keys(name, frame)
        if slot_of_old_token.get(int(t), -1) != slot_of(k)
    })
    migrated.timers_read = len(timers)
    timer_rows = [
        {GROUPING_COLUMN: token, STATE_VAR_COLUMN: TIMER_VAR, EXPIRY_COLUMN: int(expiry)}
        for old_token, expiry in zip(timers["old_token"].to_numpy(np.int64), timers[EXPIRY_COLUMN].to_numpy(np.int64))
        for token in sorted(receivers.get(int(old_token), ()))
    ]
    timer_frame = pd.DataFrame(timer_rows).drop_duplicates() if timer_rows else pd.DataFrame()
    migrated.timers_written = len(timer_frame)
    schema = initial_state_schema(variables)
    frames = [f for f in (*out_frames, timer_frame) if len(f)]
    combined = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    migrated.rows = combined.reindex(columns=schema.fieldNames())
    migrated.rows[GROUPING_COLUMN] = migrated.rows[GROUPING_COLUMN].astype(np.int32)
    for f in schema.fields:  # a long is NULL in another variable's rows: nullable Int64, never float
        if isinstance(f.dataType, T.LongType):
            migrated.rows[f.name] = migrated.rows[f.name].astype("Int64")
    return migrated


def _broadcast_rows(shared: pd.DataFrame, variable: MapStateVariable, new_tokens: Sequence[int]) -> pd.DataFrame:
    """Rows of `variable.broadcast` entries for the initial state: each entry merged over its old
    slots (`variable.merge`, else the first) and written once per new slot token."""
    merged = []
    for key, group in shared.groupby("key", sort=False):
        values = [tuple(row) for row in group[variable.value_fields].itertuples(index=False)]
        value = variable.merge(values) if variable.merge is not None and len(values) > 1 else values[0]
        for token in new_tokens:
            merged.append({"key": key, GROUPING_COLUMN: int(token), **dict(zip(variable.value_fields, value)), STATE_VAR_COLUMN: variable.name})
    return pd.DataFrame(merged)


def save_migrated(migrated: MigratedState, path: Path) -> Path:
    """Write the initial-state rows to a Parquet file (atomically), so a driver that dies before
    the new query's first commit can start it again with the same state."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    rows = migrated.rows.copy()
    partial = path.with_suffix(".tmp")
    pq.write_table(pa.Table.from_pandas(rows, preserve_index=False), partial)
    partial.replace(path)
    return path


def verify_placement(spark: SparkSession, checkpoint: Path, variables: Sequence[MapStateVariable],
                     slots_of: Callable[[str], Sequence[int]], batch_id: int | None = None) -> dict[str, Any]:
    """Check that every key's state in `checkpoint` sits on one of its assigned slots.

    Args:
        slots_of: key -> the slots the assignment gives it (one, or a split key's pieces).

    Returns:
        {"state_rows": rows checked, "misplaced": [up to 10 (variable, key, partition_id)], "ok": bool}.
    """
    checked, misplaced = 0, []
    for variable in variables:
        frame = (_state_reader(spark, checkpoint, batch_id).option("stateVarName", variable.name).load()
                 .selectExpr(f"user_map_key.{variable.key_field} AS key", "partition_id").toPandas())
        if variable.broadcast is not None:  # per-slot entries (e.g. nkey groups) may sit anywhere
            frame = frame[~frame["key"].astype(str).map(variable.broadcast).to_numpy(bool)]
        checked += len(frame)
        for key, partition in zip(frame["key"], frame["partition_id"]):
            if int(partition) not in slots_of(str(key)):
                misplaced.append((variable.name, str(key), int(partition)))
    return {"state_rows": checked, "misplaced": misplaced[:10], "misplaced_rows": len(misplaced), "ok": not misplaced}
