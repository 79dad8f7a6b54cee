"""Local Merge on Arrow (`partials_arrow`, what the job runs) gives exactly `partials_of`'s rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from keyshift.eventtime.windows import HOUR_MS
from keyshift.jobs.flight_delays import FLIGHT_DELAYS
from keyshift.placement.tokens import slot_tokens
from keyshift.processing.operators.exchange import Emit
from keyshift.processing.operators.local_merge import arrow_partial_schema, input_columns, partials_arrow, partials_of, per_kafka_partition

T0 = 978_307_200_000
TOKENS = np.array(slot_tokens(8), dtype=np.int32)
HOME = {"ORD": 1, "LGA": 2, "SFO": 6, "ÅRE": 3}


def token_of(origin: str) -> int:
    return int(TOKENS[HOME[origin]])


def events(n: int, seed: int, dead_share: float) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    dead = rng.random(n) < dead_share
    origins = rng.choice(list(HOME), size=n).astype(object)
    frame = pd.DataFrame(
        {
            "origin": origins,
            "destination": rng.choice(["JFK", "BOS", "ÖST"], size=n).astype(object),
            "delay_min": rng.integers(-20, 120, size=n),
            "distance_mi": rng.integers(0, 3_000, size=n),
            "event_time_ms": T0 + rng.integers(0, 6 * HOUR_MS, size=n),  # out of order within the slice
            "event_id": rng.permutation(n).astype(np.int64),
            "dead_letter_reason": np.where(dead, "malformed JSON", None),
            "raw_value": np.where(dead, "{oops", None),
            "raw_encoding": np.where(dead, "utf-8", None),
            "raw_key_base64": np.where(dead, "T1JE", None),
            "kafka_partition": np.int32(seed % 8),
            "kafka_offset": np.arange(n, dtype=np.int64) + 1_000,
        },
        columns=list(input_columns(FLIGHT_DELAYS)),
    )
    for column in ("origin", "destination", "delay_min", "distance_mi", "event_time_ms", "event_id"):
        frame[column] = frame[column].astype(object).where(~dead, None)
    return frame


def as_comparable(frame: pd.DataFrame) -> list[tuple]:
    def norm(v):
        if isinstance(v, (list, np.ndarray)):
            return tuple(int(x) if isinstance(x, (int, np.integer)) else x for x in v)
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return None
        return int(v) if isinstance(v, (np.integer,)) else v
    return [tuple(norm(v) for v in row) for row in frame.itertuples(index=False)]


def arrow_input(frame: pd.DataFrame) -> pa.Table:
    schema = pa.schema([("origin", pa.string()), ("destination", pa.string()), ("delay_min", pa.int64()),
                        ("distance_mi", pa.int64()), ("event_time_ms", pa.int64()), ("event_id", pa.int64()),
                        ("dead_letter_reason", pa.string()), ("raw_value", pa.string()), ("raw_encoding", pa.string()),
                        ("raw_key_base64", pa.string()), ("kafka_partition", pa.int32()), ("kafka_offset", pa.int64())])
    return pa.Table.from_pandas(frame, schema=schema, preserve_index=False)


@pytest.mark.parametrize(("seed", "dead_share", "split"), [(0, 0.0, False), (1, 0.1, False), (2, 0.05, True), (3, 1.0, False)])
def test_arrow_partials_equal_the_pandas_definition(seed, dead_share, split):
    frame = events(3_000, seed, dead_share)
    split_tokens = {"ORD": TOKENS[[1, 5, 0]]} if split else None
    expected = partials_of(frame, FLIGHT_DELAYS, token_of, TOKENS, HOUR_MS, split_tokens)
    got = partials_arrow(arrow_input(frame), FLIGHT_DELAYS, token_of, TOKENS, HOUR_MS, split_tokens)
    assert got.schema == arrow_partial_schema(FLIGHT_DELAYS)
    assert got.num_rows == len(expected) and sum(got.column("count").to_pylist()) == 3_000
    assert as_comparable(got.to_pandas()) == as_comparable(expected)


def test_an_empty_slice_gives_an_empty_table_of_the_schema():
    got = partials_arrow(arrow_input(events(0, 0, 0.0)), FLIGHT_DELAYS, token_of, TOKENS, HOUR_MS)
    assert got.num_rows == 0 and got.schema == arrow_partial_schema(FLIGHT_DELAYS)


def two_partitions(n: int, seed: int, dead_share: float) -> pd.DataFrame:
    """A coalesced ingest task's slice: two Kafka partitions' records one after the other, the
    same keys in both (a round_robin topic)."""
    first, second = events(n, seed, dead_share), events(n, seed + 8, dead_share)
    first["kafka_partition"], second["kafka_partition"] = np.int32(3), np.int32(4)
    second["event_id"] = second["event_id"] + n
    return pd.concat([first, second], ignore_index=True)


@pytest.mark.parametrize("dead_share", [0.0, 0.1])
def test_a_partial_never_spans_two_kafka_partitions(dead_share):
    frame = two_partitions(2_000, 5, dead_share)
    expected = partials_of(frame, FLIGHT_DELAYS, token_of, TOKENS, HOUR_MS)
    got = partials_arrow(arrow_input(frame), FLIGHT_DELAYS, token_of, TOKENS, HOUR_MS)
    assert as_comparable(got.to_pandas()) == as_comparable(expected)
    assert sum(got.column("count").to_pylist()) == 4_000
    # every partial's offsets are those of its own partition's events
    where = {(int(p), int(o)): event for p, o, event in zip(frame["kafka_partition"], frame["kafka_offset"], frame["event_id"])}
    rows = got.to_pandas()
    for partition, offsets, ids in zip(rows["kafka_partition"], rows["kafka_offsets"], rows["event_ids"]):
        if ids is not None:
            assert [where[(int(partition), int(o))] for o in offsets] == [int(i) for i in ids]
    # the same (key, window, token) in both partitions makes two partials, one per partition
    valid = rows[rows["dead_letter_reason"].isna()]
    per_group = valid.groupby(["origin", "window_start_ms", "token"])["kafka_partition"].nunique()
    assert per_group.max() == 2


def test_per_kafka_partition_refines_segments_only_when_a_slice_has_several():
    one = np.array([5, 5, 5])
    assert per_kafka_partition(None, one) is None
    segments = np.array([0, 1, 1])
    assert per_kafka_partition(segments, one) is segments
    refined = per_kafka_partition(np.array([0, 1, 0, 1]), np.array([2, 2, 3, 3]))
    assert len(set(refined.tolist())) == 4
    assert per_kafka_partition(None, np.array([2, 3, 2])).tolist() == [2, 3, 2]


def test_count_emit_over_two_kafka_partitions_keeps_every_event():
    frame = two_partitions(1_500, 6, 0.0)
    got = partials_arrow(arrow_input(frame), FLIGHT_DELAYS, token_of, TOKENS, HOUR_MS, emit=Emit("count", 500))
    assert sum(got.column("count").to_pylist()) == 3_000
    rows = got.to_pandas()
    assert all(len(set(o)) == len(o) for o in rows["kafka_offsets"])
