"""Final windows to Redis, laid out as the Yahoo Streaming Benchmark's published jobs keep them.

The published jobs (yahoo/streaming-benchmarks, `CampaignProcessorCommon.writeWindow`) keep, per
campaign, a hash `window timestamp -> window id` and a list of the campaign's windows, and per
window a hash with `seen_count` (views) and `time_updated` (the wall-clock time of the last
write, from which the benchmark measures latency). A spec with `redis_windows`
(`keyshift.jobs.spec.JobSpec`) has its sink write the same per final window, under one run
(names in `keyshift.names`):

| key | type | content |
| --- | --- | --- |
| `redis_ysb_window_key(run, key, start)` | hash | `seen_count` = the window's count, `time_updated` = wall ms of the write |
| `redis_ysb_campaign_key(run, key)` | hash | window_start_ms -> that window's key |
| `redis_ysb_campaign_windows_key(run, key)` | sorted set | the key's window starts (score = start, ms) |
| `redis_ysb_run_campaigns_key(run)` | set | the keys with at least one window |

Three departures, all so that a micro-batch replayed after a crash rewrites the same values
instead of adding them twice (keyshift emits each window once, final): window ids are derived
from (run, key, start) instead of random UUIDs, the listing is a sorted set instead of a list,
and `seen_count` is set rather than incremented.
"""

from __future__ import annotations

import time

import pandas as pd

from keyshift.errors import StackError
from keyshift.names import (
    redis_ysb_campaign_key,
    redis_ysb_campaign_windows_key,
    redis_ysb_run_campaigns_key,
    redis_ysb_window_key,
)


class RedisWindowWriter:
    """Writes a run's final windows to Redis (module docstring).

    Args:
        client: a `redis.Redis` client (`decode_responses=True` for `read_windows`).
        run_id: the run the keys are under.
        key: the windows' key column (YSB: campaign_id).
    """

    def __init__(self, client, run_id: str, key: str) -> None:
        self._client = client
        self.run_id = run_id
        self.key = key

    def write(self, windows: pd.DataFrame, now_ms: int | None = None) -> int:
        """Write `windows` (processor `window` rows: the key column, `window_start_ms` (epoch ms
        of event time), `count` (events)) in one pipelined MULTI/EXEC; `now_ms` (wall ms,
        default now) becomes each window's `time_updated`. Returns the windows written.

        Raises:
            StackError: Redis failed.
        """
        import redis

        if windows.empty:
            return 0
        now_ms = int(time.time() * 1000) if now_ms is None else int(now_ms)
        pipe = self._client.pipeline(transaction=True)
        keys = windows[self.key].astype(str).to_numpy()
        starts = windows["window_start_ms"].astype("int64").to_numpy()
        counts = windows["count"].astype("int64").to_numpy()
        for key, start, count in zip(keys, starts, counts):
            window = redis_ysb_window_key(self.run_id, key, int(start))
            pipe.hset(window, mapping={"seen_count": int(count), "time_updated": now_ms})
            pipe.hset(redis_ysb_campaign_key(self.run_id, key), str(int(start)), window)
            pipe.zadd(redis_ysb_campaign_windows_key(self.run_id, key), {str(int(start)): int(start)})
        pipe.sadd(redis_ysb_run_campaigns_key(self.run_id), *set(keys))
        try:
            pipe.execute()
        except redis.RedisError as exc:
            raise StackError(f"Redis failed writing {len(windows)} windows of run {self.run_id}: {exc}") from exc
        return len(windows)


def read_windows(client, run_id: str, key: str = "campaign_id") -> pd.DataFrame:
    """Every window a run wrote to Redis, read back through the campaign listings.

    Args:
        client: a `redis.Redis` client with `decode_responses=True`.
        run_id: the run.
        key: the name of the key column of the result.

    Returns:
        A frame with columns `key`, `window_start_ms` (int64, epoch ms), `seen_count` (int64,
        events), `time_updated` (int64, wall ms), sorted by key and window start; empty when the
        run wrote nothing.
    """
    rows = []
    for campaign in sorted(client.smembers(redis_ysb_run_campaigns_key(run_id))):
        starts = client.zrange(redis_ysb_campaign_windows_key(run_id, campaign), 0, -1)
        ids = client.hmget(redis_ysb_campaign_key(run_id, campaign), starts) if starts else []
        pipe = client.pipeline(transaction=False)
        for window in ids:
            pipe.hmget(window, "seen_count", "time_updated")
        for start, (seen, updated) in zip(starts, pipe.execute()):
            rows.append((campaign, int(start), int(seen), int(updated)))
    frame = pd.DataFrame(rows, columns=[key, "window_start_ms", "seen_count", "time_updated"])
    return frame.astype({"window_start_ms": "int64", "seen_count": "int64", "time_updated": "int64"})
