"""The pieces of a split key's windows, held by the sink until every piece has closed the window.

hot_split spreads a hot key over k slots (pieces); each piece keeps its own window state. In the
`global` watermark mode every piece closes a window in the same micro-batch (one watermark for
all), and `keyshift.processing.outputs.sinks.merge_split_windows` folds them there. In a per-key mode
each piece has its own watermark (paper 000 §4.1 at the finest grain: a piece is a key on its
slot), so the pieces of one window close in different batches. `PieceAssembler` keeps the
pieces that arrived, and the watermark each piece reported (`watermark` rows of the processor),
and writes the merged window once every piece has closed it:

    a window [start, end) of split key k is complete when, for every slot s holding a piece of
    k, max(watermark reported by (k, s), fallback) >= end

(the fallback is the query's global watermark, which every key's watermark is held above, so a
piece that falls silent or holds no event of that window still lets the window complete). A key
that a switch made whole again (no longer split) completes its held windows when its one slot's
watermark passes them; a whole-key row for a held window is merged with its pieces.

The held pieces are part of the run's state: after every micro-batch the assembler writes a
snapshot `runs/<run_id>/pieces/after-<batch>.parquet` (rewritten if Spark replays the batch),
and a batch always starts from the snapshot of the batch before it, so a replayed batch after a
crash neither loses nor doubles a piece. The watermarks reported by pieces are reset when a new
segment (a switch) starts: the slots of the old placement no longer speak for the key.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from keyshift.jobs.spec import JobSpec

SNAPSHOT = re.compile(r"after-(\d+)\.parquet$")


def merge_window_rows(windows: pd.DataFrame, spec: JobSpec) -> pd.DataFrame:
    """One row per (key, window_start_ms) of `window` rows: count adds, each aggregate merges by
    its op, the outputs are recomputed by the spec's rule, `slot` is the lowest slot that held a
    piece, other columns come from that piece."""
    ordered = windows.sort_values([spec.key, "window_start_ms", "slot"], kind="stable")
    grouped = ordered.groupby([spec.key, "window_start_ms"], sort=False)
    merged = grouped.first().reset_index()
    merged["count"] = grouped["count"].sum().to_numpy()
    for aggregate in spec.aggregates:
        merged[aggregate.name] = grouped[aggregate.name].agg(aggregate.op).to_numpy()
    values = spec.window_values(merged["count"].to_numpy(np.int64), {a: merged[a].to_numpy(np.int64) for a in spec.aggregate_names})
    for name in spec.outputs:
        merged[name] = values[name]
    return merged[windows.columns]


class PieceAssembler:
    """Holds split keys' window pieces across micro-batches (module docstring).

    Args:
        spec: the job (key, aggregates, output rule).
        directory: where the snapshots go (`runs/<run_id>/pieces/`).
        split: the split keys of the current segment -> their slots (hot_split), or None.
        segment_batch_base: run-wide id of the current segment's first batch: reported
            watermarks of snapshots before it are dropped.
    """

    def __init__(self, spec: JobSpec, directory: Path, split: dict[str, tuple[int, ...]] | None, segment_batch_base: int = 0) -> None:
        self.spec = spec
        self.directory = Path(directory)
        self.split = {str(k): tuple(int(s) for s in v) for k, v in (split or {}).items()}
        self.segment_batch_base = int(segment_batch_base)
        self._snapshots = {int(m.group(1)): p for p in self.directory.glob("after-*.parquet") if (m := SNAPSHOT.search(p.name))}

    def _base(self, batch_id: int) -> tuple[pd.DataFrame | None, dict[tuple[str, int], int], int]:
        """(held pieces, reported watermarks, fallback) after the last batch before `batch_id`."""
        earlier = [b for b in self._snapshots if b < batch_id]
        if not earlier:
            return None, {}, np.iinfo(np.int64).min
        last = max(earlier)
        table = pq.read_table(self._snapshots[last])
        meta = json.loads(table.schema.metadata[b"keyshift"]) if table.schema.metadata and b"keyshift" in table.schema.metadata else {}
        marks = {(o, int(s)): int(w) for o, s, w in meta.get("watermarks", [])}
        if last < self.segment_batch_base:
            marks = {}
        held = table.to_pandas()
        return (held if len(held) else None), marks, int(meta.get("fallback_ms", np.iinfo(np.int64).min))

    def held_events(self, batch_id: int | None = None) -> int:
        """Events in pieces held after `batch_id` (default: the last snapshot); 0 if none."""
        if not self._snapshots:
            return 0
        last = max(self._snapshots) if batch_id is None else batch_id
        held, _, _ = self._base(last + 1)
        return int(held["count"].sum()) if held is not None else 0

    def assemble(self, windows: pd.DataFrame, watermarks: pd.DataFrame, fallback_ms: int | None, batch_id: int) -> tuple[pd.DataFrame, int]:
        """The windows to write for `batch_id`, with split keys' pieces held until complete.

        Args:
            windows: `window` rows of the batch (processor `OUTPUT_SCHEMA` columns).
            watermarks: `watermark` rows of the batch (origin, slot, watermark_ms).
            fallback_ms: the batch's global watermark (max `global_watermark_ms`), or None.
            batch_id: run-wide batch id.

        Returns:
            (windows to write: whole keys' rows and completed merged windows; pieces merged away:
            piece rows folded into a completed window minus the windows they made).
        """
        held, marks, fallback = self._base(batch_id)
        if held is not None and set(windows.columns) <= set(held.columns):
            held = held[list(windows.columns)]  # a snapshot written with more of the output's columns
        if fallback_ms is not None:
            fallback = max(fallback, int(fallback_ms))
        key = self.spec.key
        held_origins = set(held[key]) if held is not None else set()
        for origin, slot, mark in zip(watermarks.get(key, []), watermarks.get("slot", []), watermarks.get("watermark_ms", [])):
            if origin in self.split or origin in held_origins:
                piece = (str(origin), int(slot))
                marks[piece] = max(marks.get(piece, np.iinfo(np.int64).min), int(mark))
        if not self.split and held is None:
            self._snapshot(batch_id, None, {}, fallback)
            return windows, 0
        is_piece = windows[key].isin(set(self.split) | held_origins).to_numpy() if len(windows) else np.zeros(0, bool)
        direct = windows[~is_piece]
        frames = [f for f in (held, windows[is_piece]) if f is not None and len(f)]
        if not frames:
            self._snapshot(batch_id, None, marks, fallback)
            return direct, 0
        pieces = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0].reset_index(drop=True)
        ends = pieces["window_start_ms"].to_numpy(np.int64) + (pieces["window_end_ms"] - pieces["window_start_ms"]).to_numpy(np.int64)
        complete = np.array([self._closed_by_all(str(o), int(e), marks, fallback) for o, e in zip(pieces[key], ends)], dtype=bool)
        done = pieces[complete]
        merged = merge_window_rows(done, self.spec) if len(done) else done
        self._snapshot(batch_id, pieces[~complete], marks, fallback)
        out = (pd.concat([direct, merged], ignore_index=True) if len(direct) else merged.reset_index(drop=True)) if len(merged) else direct
        return out, len(done) - len(merged)

    def _closed_by_all(self, origin: str, end_ms: int, marks: dict[tuple[str, int], int], fallback_ms: int) -> bool:
        if fallback_ms >= end_ms:
            return True
        slots = self.split.get(origin)
        if slots is None:  # no longer split: its one slot (whichever reported) speaks for it
            return any(mark >= end_ms for (o, _s), mark in marks.items() if o == origin)
        return all(marks.get((origin, s), np.iinfo(np.int64).min) >= end_ms for s in slots)

    def _snapshot(self, batch_id: int, held: pd.DataFrame | None, marks: dict[tuple[str, int], int], fallback_ms: int) -> None:
        if held is None and not marks and not self._snapshots:
            return  # nothing was ever split: no files
        self.directory.mkdir(parents=True, exist_ok=True)
        frame = held if held is not None else pd.DataFrame()
        table = pa.Table.from_pandas(frame, preserve_index=False) if len(frame.columns) else pa.table({self.spec.key: pa.array([], pa.string()), "count": pa.array([], pa.int64())})
        meta = {"watermarks": [[o, s, w] for (o, s), w in sorted(marks.items())], "fallback_ms": int(fallback_ms)}
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"keyshift": json.dumps(meta).encode()})
        final = self.directory / f"after-{batch_id:08d}.parquet"
        partial = final.with_suffix(".tmp")
        pq.write_table(table, partial)
        partial.replace(final)
        self._snapshots[batch_id] = final
