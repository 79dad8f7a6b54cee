"""Global Merge (paper 000 §4.3 (2)): no keyed exchange; every task merges into one state in Redis.

The `global_merge` exchange (`keyshift.processing.operators.exchange`). The query has no shuffle and no
stateful operator:

    Kafka -> ingest + Local Merge (`keyshift.processing.operators.ingest`, one mapInArrow per Kafka
    partition) -> Spark's watermark over each partial's largest event time -> foreachBatch:
        1. on the executors, one task per Kafka partition (`merge_function`): dead letters and
           late partials (window end <= the batch's watermark W_b, the rule of the stateful
           processor) become output rows; every other partial is merged into its window's hash
           in Redis with one Lua script call per task (count and sums added, max/min kept);
        2. on the driver (`GlobalMergeSink`): W_{b+1} = max(W_b, largest event time of the batch
           - bound) is the watermark Spark will give batch b + 1; every window with end <= W_{b+1}
           is final: read from Redis, routed through the engine's sink (windows table, alerts,
           the YSB Redis layout, ledger) as the processor's `window` rows, then deleted.

What it saves: no shuffle write or read at all (Spark's shuffle write metrics are 0 for the
query), no state store, no Python worker of a stateful stage. What it costs: one Redis round
trip per task per micro-batch plus the Lua work per partial (Redis is single-threaded, so its
throughput bounds the job's), and the closed windows' reads on the driver. A window is written
in the batch whose events move the watermark past its end, one batch earlier than the
processor's timers close it, so its output latency is no higher than with the shuffle.

Results equal the processor's: lateness uses the same W_b (Spark's offset log), windows close
on the same watermark, and the partials are associative. Exactly once: each task's merge is
applied under a token (batch id, Spark partition) kept in a per-batch set, so a task retried or
a batch replayed after a crash never merges twice; the windows a batch closes are deleted from
Redis only when the next batch starts, after Spark committed the batch, so a replayed batch finds
and routes them again (the sink rewrites, never appends, a replayed batch's outputs).

Limits, by construction: `global` watermark mode only (per-key clocks live in the processor's
state); duplicated event ids are not dropped (the processor does it with the ids it keeps per
open window; here they would cost one Redis member per event); max/min compare as Lua numbers,
exact up to 2^53; a run with this exchange cannot be switched (its state does not depend on the
placement: a switch would only re-place the producers).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from keyshift.errors import StackError
from keyshift.names import REDIS_PREFIX
from keyshift.processing.operators.output_rows import OutputRows, rows_frame
from keyshift.processing.operators.processor import KIND_LOAD, KeyedWindowProcessor, output_schema
from keyshift.jobs.spec import JobSpec

log = logging.getLogger(__name__)

MERGE_SCRIPT = """
-- KEYS[1] = the batch's applied-token set, KEYS[2] = the open windows (sorted set, score = end ms)
-- ARGV[1] = window hash prefix, ARGV[2] = token, ARGV[3] = a (aggregates), ARGV[4 .. 3+a] = ops,
-- then per partial: member, window end ms, slot, count, a values
if redis.call('SADD', KEYS[1], ARGV[2]) == 0 then return 0 end
local a = tonumber(ARGV[3])
local i = 4 + a
local merged = 0
while i <= #ARGV do
  local member = ARGV[i]
  local key = ARGV[1] .. member
  redis.call('HINCRBY', key, 'count', ARGV[i + 3])
  if redis.call('HSETNX', key, 'slot', ARGV[i + 2]) == 1 then
    redis.call('ZADD', KEYS[2], ARGV[i + 1], member)
  end
  for j = 1, a do
    local op = ARGV[3 + j]
    local value = ARGV[i + 3 + j]
    local field = 'a' .. j
    if op == 'sum' then
      redis.call('HINCRBY', key, field, value)
    else
      local current = redis.call('HGET', key, field)
      if (not current) or (op == 'max' and tonumber(value) > tonumber(current))
          or (op == 'min' and tonumber(value) < tonumber(current)) then
        redis.call('HSET', key, field, value)
      end
    end
  end
  merged = merged + 1
  i = i + 4 + a
end
return merged
"""
"""The per-task merge: applied once per token; returns the partials merged (0: already applied)."""

SEPARATOR = "\x1f"
"""Between key and window start in a window's member name (a key never holds it: keys are
printable; `keyshift.processing.operators.records`)."""


class GlobalMergeState:
    """A run's global window state in Redis (module docstring).

    Layout under `<prefix>:global_merge:<run_id>:`: `open` (sorted set: member `key\\x1fstart`,
    score = window end, ms), `w:<member>` (hash: `count`, `slot`, `a1` … `aN` = the spec's
    aggregates in order), `applied:<batch>` (set of task tokens merged in that batch),
    `closed_through` (the watermark through which windows have been routed, ms).

    Args:
        client: a `redis.Redis` client (`decode_responses=True`).
        run_id: the run.
        spec: the job (aggregates).
    """

    def __init__(self, client, run_id: str, spec: JobSpec) -> None:
        self.client = client
        self.spec = spec
        self.prefix = f"{REDIS_PREFIX}:global_merge:{run_id}:"
        self.open_key = self.prefix + "open"
        self.window_prefix = self.prefix + "w:"

    def applied_key(self, batch_id: int) -> str:
        """The set of task tokens merged in `batch_id`."""
        return f"{self.prefix}applied:{int(batch_id)}"

    def merge(self, batch_id: int, token: str, partials: pd.DataFrame, slots: np.ndarray) -> int:
        """Merge one task's open partials into the global state, once per (batch, token).

        Args:
            batch_id: the run-wide batch id. token: the task's token (its Spark partition).
            partials: rows with the key column, `window_start_ms`, `count` and the aggregates.
            slots: int array, each partial's slot (the slot its key is placed on).

        Returns:
            Partials merged; 0 if this token was already applied (a retried task).

        Raises:
            StackError: Redis failed.
        """
        import redis

        a = len(self.spec.aggregates)
        args: list = [self.window_prefix, token, a, *[agg.op for agg in self.spec.aggregates]]
        members = partials[self.spec.key].astype(str) + SEPARATOR + partials["window_start_ms"].astype("int64").astype(str)
        columns = [members.tolist(), partials["window_end_ms"].astype("int64").tolist(), np.asarray(slots, np.int64).tolist(),
                   partials["count"].astype("int64").tolist(), *[partials[agg.name].astype("int64").tolist() for agg in self.spec.aggregates]]
        for values in zip(*columns):  # per partial: member, end, slot, count, aggregates
            args.extend(values)
        try:
            return int(self.client.eval(MERGE_SCRIPT, 2, self.applied_key(batch_id), self.open_key, *args))
        except redis.RedisError as exc:
            raise StackError(f"Redis failed merging {len(partials)} partials of batch {batch_id} (task {token}): {exc}") from exc

    def closed(self, watermark_ms: int) -> pd.DataFrame:
        """The windows whose end is <= `watermark_ms` (ms of event time), read from Redis.

        Returns:
            A frame: the key column, `window_start_ms`, `count`, each aggregate, `slot`,
            `member` (the window's member name), sorted by window end.

        Raises:
            StackError: Redis failed.
        """
        import redis

        try:
            members = self.client.zrangebyscore(self.open_key, "-inf", int(watermark_ms))
            pipe = self.client.pipeline(transaction=False)
            for member in members:
                pipe.hgetall(self.window_prefix + member)
            hashes = pipe.execute() if members else []
        except redis.RedisError as exc:
            raise StackError(f"Redis failed reading the windows closed at watermark {watermark_ms}: {exc}") from exc
        keys, starts = zip(*(m.rsplit(SEPARATOR, 1) for m in members)) if members else ((), ())
        frame = {
            self.spec.key: list(keys),
            "window_start_ms": np.array([int(s) for s in starts], np.int64),
            "count": np.array([int(h["count"]) for h in hashes], np.int64),
            "slot": np.array([int(h["slot"]) for h in hashes], np.int64),
            "member": list(members),
        }
        for j, agg in enumerate(self.spec.aggregates, start=1):
            frame[agg.name] = np.array([int(h[f"a{j}"]) for h in hashes], np.int64)
        return pd.DataFrame(frame)

    def members_through(self, watermark_ms: int) -> list[str]:
        """The member names of the windows ending at or before `watermark_ms` (ms), without
        reading their values (what `forget` needs).

        Raises:
            StackError: Redis failed.
        """
        import redis

        try:
            return list(self.client.zrangebyscore(self.open_key, "-inf", int(watermark_ms)))
        except redis.RedisError as exc:
            raise StackError(f"Redis failed listing the windows closed at watermark {watermark_ms}: {exc}") from exc

    def forget(self, members: Sequence[str], batch_id: int, keep_batches: int = 10) -> None:
        """Delete closed windows `members` and the applied tokens of batches before
        `batch_id - keep_batches` (only the last batches can be replayed).

        Raises:
            StackError: Redis failed.
        """
        import redis

        try:
            pipe = self.client.pipeline(transaction=True)
            for start in range(0, len(members), 10_000):
                chunk = list(members[start:start + 10_000])
                pipe.zrem(self.open_key, *chunk)
                pipe.delete(*[self.window_prefix + m for m in chunk])
            if batch_id - keep_batches >= 0:
                pipe.delete(self.applied_key(batch_id - keep_batches))
            pipe.execute()
        except redis.RedisError as exc:
            raise StackError(f"Redis failed deleting {len(members)} closed windows: {exc}") from exc

    def set_closed_through(self, batch_id: int, watermark_ms: int) -> None:
        """Record that batch `batch_id` routed every window ending at or before `watermark_ms`."""
        self.client.hset(self.prefix + "closed_through", str(int(batch_id)), int(watermark_ms))

    def closed_through(self, batch_id: int | None = None) -> int | None:
        """The watermark through which batch `batch_id` (default: the latest batch recorded)
        closed windows (ms); None when it recorded none."""
        recorded = self.client.hgetall(self.prefix + "closed_through")
        if not recorded:
            return None
        key = str(int(batch_id)) if batch_id is not None else max(recorded, key=int)
        return int(recorded[key]) if key in recorded else None

    def pending_events(self) -> int:
        """Events in windows not yet closed: Σ count over the windows ending after
        `closed_through()` (closed windows stay in Redis until the next batch starts)."""
        through = self.closed_through()
        members = self.client.zrangebyscore(self.open_key, f"({through}" if through is not None else "-inf", "+inf")
        pipe = self.client.pipeline(transaction=False)
        for member in members:
            pipe.hget(self.window_prefix + member, "count")
        return int(sum(int(c or 0) for c in pipe.execute())) if members else 0

    def clear(self) -> None:
        """Delete the run's whole global state (a new run under a reused id)."""
        names = list(self.client.scan_iter(match=self.prefix + "*", count=10_000))
        for start in range(0, len(names), 10_000):
            self.client.delete(*names[start:start + 10_000])


def merge_function(spec: JobSpec, redis_url: str, run_id: str, batch_id: int, watermark_ms: int, window_ms: int,
                   tokens: tuple[int, ...]):
    """The executor side of one micro-batch (module docstring, step 1).

    Args:
        spec: the job. redis_url: the run's Redis. run_id: the run.
        batch_id: the run-wide batch id. watermark_ms: W_b, the batch's watermark (ms of event
            time, floored). window_ms: tumbling window size (ms). tokens: the slot tokens in
            force (`tokens[slot]`), to name each partial's slot.

    Returns:
        A `mapInArrow` function: Arrow batches of stage rows (`keyshift.processing.operators.ingest.
        stage_schema` of Local Merge's partials, markers included) -> Arrow batches of
        `output_schema(spec)`: dead letters, late events, and one `load` row per task whose
        `count` is the events it processed and whose `event_time_ms` is the largest event time
        of its rows (markers included; NULL when none).
    """
    from pyspark import TaskContext
    from pyspark.sql.pandas.types import to_arrow_schema

    out_schema = to_arrow_schema(output_schema(spec))

    def merge(chunks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import redis

        from keyshift.processing.operators.ingest import CONTROL_COLUMN, EVENT_TS_COLUMN

        batches = [chunk for chunk in chunks if chunk.num_rows]
        if not batches:
            return
        table = pa.Table.from_batches(batches)
        rows = KeyedWindowProcessor(spec, tokens, window_ms)  # its row builders only; no state
        slot_of_token = {token: slot for slot, token in enumerate(tokens)}
        # event times are UTC microseconds; a marker's may be past what pandas' nanoseconds hold
        largest = pc.max(table.column(EVENT_TS_COLUMN).cast(pa.int64())).as_py()
        largest = None if largest is None else largest // 1000
        partitions = pc.drop_null(table.column("kafka_partition"))
        slot = int(partitions[0].as_py()) % len(tokens) if len(partitions) else -1
        controls = pc.fill_null(table.column(CONTROL_COLUMN), False)
        partials = table.filter(pc.invert(controls)).drop_columns([EVENT_TS_COLUMN, CONTROL_COLUMN])
        processed = int(pc.sum(partials.column("count")).as_py() or 0)
        out = []
        # only the rows that leave one by one (dead letters, late partials) need their event
        # lists in pandas; an open partial is merged by its key, window, count and aggregates
        rejected = np.asarray(partials.column("dead_letter_reason").is_valid(), dtype=bool)
        ends = pc.fill_null(partials.column("window_start_ms"), 0).to_numpy().astype(np.int64) + window_ms
        late = ~rejected & (ends <= watermark_ms)
        if rejected.any():
            out.append(rows._dead_letters(partials.filter(pa.array(rejected)).to_pandas(), slot))
        if late.any():
            out.append(rows._late_events(partials.filter(pa.array(late)).to_pandas(), slot, watermark_ms))
        keep = ~rejected & ~late
        merged_columns = ["token", spec.key, "window_start_ms", "count", *spec.aggregate_names]
        open_partials = partials.select(merged_columns).filter(pa.array(keep)).to_pandas().assign(window_end_ms=ends[keep])
        if len(open_partials):
            context = TaskContext.get()
            token = f"{context.partitionId() if context is not None else slot}"
            state = GlobalMergeState(redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=60), run_id, spec)
            slots = np.array([slot_of_token.get(int(t), -1) for t in open_partials["token"]], np.int64)
            state.merge(batch_id, token, open_partials, slots)
        load = rows._load(slot, -1, processed, watermark_ms)
        out.append(load._replace(columns={**load.columns, "event_time_ms": [largest]}))
        frame_out = rows_frame(out, out_schema.names)
        yield from pa.Table.from_pandas(frame_out, schema=out_schema, preserve_index=False).to_batches()

    return merge


def next_watermark(watermark_ms: int, loads: pd.DataFrame, delay_ms: int) -> int:
    """W_{b+1} = max(W_b, largest event time of the batch's `load` rows - delay): the watermark
    Spark computes for the next batch (its `withWatermark` delay `delay_ms`, ms)."""
    largest = loads["event_time_ms"].dropna()
    if not len(largest):
        return int(watermark_ms)
    return max(int(watermark_ms), int(largest.max()) - int(delay_ms))


def window_rows(spec: JobSpec, closed: pd.DataFrame, window_ms: int, tokens: tuple[int, ...], watermark_ms: int) -> pd.DataFrame:
    """`closed` windows (`GlobalMergeState.closed`) as the processor's `window` rows."""
    rows = KeyedWindowProcessor(spec, tokens, window_ms)
    columns = output_schema(spec).fieldNames()
    if closed.empty:
        return rows_frame([OutputRows("window", 0, {})], columns)
    aggregates = np.array([closed[a.name].to_numpy(np.int64) for a in spec.aggregates]).reshape(len(spec.aggregates), len(closed))
    frame = rows_frame([rows._windows(-1, None, closed[spec.key].tolist(), closed["window_start_ms"].to_numpy(np.int64),
                                      closed["count"].to_numpy(np.int64), aggregates, [watermark_ms] * len(closed), watermark_ms)],
                       columns)
    frame["slot"] = closed["slot"].to_numpy()
    return frame


def is_load(rows: pd.DataFrame) -> np.ndarray:
    """Which rows are `load` rows (bool array)."""
    return (rows["kind"] == KIND_LOAD).to_numpy()


class GlobalMergeSink:
    """The `foreachBatch` of a `global_merge` run (module docstring, steps 1 and 2).

    Wraps the engine's sink (`keyshift.processing.outputs.sinks.KeyedWindowSink`, which it exposes as
    `sink`): per batch it deletes the windows earlier batches closed, runs `merge_function` on
    the executors, collects the output rows, closes the windows W_{b+1} passes and routes all of
    it through `sink.route_rows`.

    Args:
        sink: the run's KeyedWindowSink. state: the run's `GlobalMergeState`.
        redis_url: for the executors. checkpoint_dir: the query's checkpoint (W_b from its
            offset log). delay_ms: the query's `withWatermark` delay (ms). window_ms: window
            size (ms). tokens: slot tokens in force. watermark_floor_ms: W never below this.
    """

    def __init__(self, sink, state: GlobalMergeState, redis_url: str, checkpoint_dir, delay_ms: int, window_ms: int,
                 tokens: tuple[int, ...], watermark_floor_ms: int = 0) -> None:
        self.sink = sink
        self.state = state
        self.redis_url = redis_url
        self.checkpoint_dir = checkpoint_dir
        self.delay_ms = int(delay_ms)
        self.window_ms = int(window_ms)
        self.tokens = tuple(tokens)
        self.watermark_floor_ms = int(watermark_floor_ms)

    def __call__(self, batch, query_batch_id: int) -> None:
        """Merge, close and route one micro-batch (called by Spark on the driver).

        Raises:
            BatchRefused: the sink's barrier was set (`KeyedWindowSink.admit`).
            StackError: Redis failed (the batch is not committed; Spark retries it on restart).
        """
        from keyshift.eventtime.plausibility import read_batch_reference
        from keyshift.processing.operators.processor import output_schema as schema_of

        sink = self.sink
        sink.admit(query_batch_id)
        try:
            batch_id = sink.batch_base + query_batch_id
            watermark = max(read_batch_reference(self.checkpoint_dir, query_batch_id).watermark_ms, self.watermark_floor_ms)
            # the windows earlier batches closed: their batches are committed (Spark runs batch b
            # after b - 1's commit), so nothing can replay them any more. Through what batch b - 1
            # closed, which is W_b unless Spark's watermark and ours ever differ.
            earlier = self.state.closed_through(batch_id - 1)
            self.state.forget(self.state.members_through(watermark if earlier is None else max(earlier, watermark)), batch_id)
            rows = batch.mapInArrow(
                merge_function(sink.spec, self.redis_url, sink.run_id, batch_id, watermark, self.window_ms, self.tokens),
                schema_of(sink.spec),
            ).toArrow().to_pandas()
            loads = rows[is_load(rows)]
            closing_at = next_watermark(watermark, loads, self.delay_ms)
            closed = self.state.closed(closing_at)
            windows = window_rows(sink.spec, closed, self.window_ms, self.tokens, closing_at)
            out = pd.concat([rows, windows], ignore_index=True) if len(windows) else rows
            sink.route_rows(out, batch_id)
            self.state.set_closed_through(batch_id, closing_at)  # deleted when the next batch starts
            log.info("batch %d: global merge at watermark %d closed %d windows", batch_id, closing_at, len(closed))
        finally:
            sink.release(query_batch_id)
