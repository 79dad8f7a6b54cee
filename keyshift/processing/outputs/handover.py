"""The state handover at a switch's barrier batch, driver side: the snapshot file.

The old query's processor emits each slot token's state in the barrier batch
(`keyshift.processing.operators.handover`); the sink takes those rows out of the batch's output
and writes them, before Spark commits the batch, to
`switches/<switch_id>/handover-<run-wide batch id>.parquet` in the run folder (`write_snapshot`). The switch then reads that file instead of the old
checkpoint (`read_snapshot`), in the same shape as Spark's state data source gives
(`keyshift.migration.state.read_state`), if and only if the file is complete: one snapshot of
every slot token, each with as many state rows as its header says. Anything else (a token that
did not run, a file from a batch that was never committed) leaves the switch to the state reader.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from keyshift.processing.operators.handover import KIND_HANDOVER, KIND_STATE, STATE_COLUMNS, TIMERS
from keyshift.processing.operators.state_variables import EXPIRY_COLUMN, MapStateVariable

log = logging.getLogger(__name__)

SNAPSHOT_COLUMNS = ("kind", "slot", "partition_id", "key", "count", *STATE_COLUMNS)
"""Columns of a snapshot file: the processor's `state` and `handover` rows, the spec's key
column renamed `key`."""


def split_snapshot(out: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(the batch's output rows without snapshot rows, the snapshot rows or None when there
    are none). `out`: one collected batch of `processor.output_schema` rows."""
    if "handover_seq" not in out.columns or not out["handover_seq"].notna().any():
        return out, None
    is_snapshot = out["kind"].isin((KIND_STATE, KIND_HANDOVER)).to_numpy()
    return out[~is_snapshot], out[is_snapshot]


def write_snapshot(rows: pd.DataFrame, key_column: str, path: Path) -> Path:
    """Write the snapshot rows of a barrier batch to `path` (Parquet, atomically: a batch that
    Spark replays writes it again, whole).

    Args:
        rows: the `state` and `handover` rows of `split_snapshot`.
        key_column: the spec's key column (the state entries' map keys).
        path: the run's `RunDir.handover(switch_id, batch_id)`.

    Returns:
        `path`.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    table = rows.rename(columns={key_column: "key"})[list(SNAPSHOT_COLUMNS)].reset_index(drop=True)
    table["state_value"] = table["state_value"].map(lambda v: None if v is None or v is pd.NA else bytes(v))
    partial = path.with_suffix(".tmp")
    pq.write_table(pa.Table.from_pandas(table, preserve_index=False), partial)
    partial.replace(path)
    return path


def read_snapshot(path: Path, variables: Sequence[MapStateVariable], tokens: Sequence[int]
                  ) -> tuple[dict[str, pd.DataFrame], pd.DataFrame] | None:
    """The old query's state at its barrier batch from the snapshot file, as
    `keyshift.migration.state.read_state` returns it, or None when it is missing or incomplete.

    Each token's latest snapshot counts (the largest `handover_seq`: Spark runs a batch's timers
    after its input, and the processor snapshots after each). Complete means: a snapshot of every
    slot 0..len(tokens)-1, each with the number of state rows its `handover` row gives.

    Args:
        path: the snapshot file (`RunDir.handover(switch_id, batch_id)`).
        variables: the job's declared state variables.
        tokens: the old query's slot tokens (`tokens[slot]`), the state's `old_token`.

    Returns:
        ({variable name: frame of old_token, partition_id, key, value fields...}, frame of
        old_token, expiry_ms, partition_id), or None (logged at INFO with the reason).
    """
    if not path.exists():
        return None
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pandas()
    headers = rows[rows["kind"] == KIND_HANDOVER]
    latest = headers.sort_values("handover_seq").groupby("slot", sort=True).tail(1).set_index("slot")
    missing = sorted(set(range(len(tokens))) - {int(s) for s in latest.index})
    if missing:
        log.info("state handover %s lacks the snapshot of slot(s) %s; reading the checkpoint instead", path.name, missing)
        return None
    state = rows[rows["kind"] == KIND_STATE]
    state = state[state["handover_seq"].to_numpy() == latest.loc[state["slot"].to_numpy(), "handover_seq"].to_numpy()]
    held = state.groupby("slot").size().reindex(latest.index, fill_value=0)
    if not (held.to_numpy() == latest["count"].to_numpy()).all():
        log.info("state handover %s is incomplete (state rows per slot %s, announced %s); reading the checkpoint instead",
                 path.name, held.to_dict(), latest["count"].to_dict())
        return None
    old_token = [int(tokens[int(s)]) for s in state["slot"]]
    state = state.assign(old_token=old_token, partition_id=state["partition_id"].astype("int64"))
    frames = {}
    for variable in variables:
        entries = state[state["state_variable"] == variable.name]
        values = [pickle.loads(v) for v in entries["state_value"]]
        frame = pd.DataFrame(values, columns=list(variable.value_fields)) if values \
            else pd.DataFrame(columns=list(variable.value_fields))
        frame.insert(0, "key", entries["key"].to_numpy(object))
        frame.insert(0, "partition_id", entries["partition_id"].to_numpy())
        frame.insert(0, "old_token", entries["old_token"].to_numpy())
        frames[variable.name] = frame
    timers = state[state["state_variable"] == TIMERS]
    timer_frame = pd.DataFrame({
        "old_token": timers["old_token"].to_numpy(),
        EXPIRY_COLUMN: [int(pickle.loads(v)[0]) for v in timers["state_value"]],
        "partition_id": timers["partition_id"].to_numpy(),
    })
    return frames, timer_frame
