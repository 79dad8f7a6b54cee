"""Bad input on the real stack (Kafka, Redis, Spark): a corpus of broken records mixed into real
flights, spread over many micro-batches; the query keeps running and every record is accounted.

12,000 real flights go into a fresh 4-partition topic (hash placement, key = origin), in three
parts; the corpus of bad records (`CORPUS`, one of each kind per part, on every partition in
turn) goes before the first part, between the parts and after the last, and copies of flights
already sent (duplicated event ids) go between the parts. The job reads 2,500 records per
micro-batch with a two-day watermark bound (no flight is late at this size), so bad records
reach the job in its first, middle and last batches; a record from 2100 comes first, the
sequence that ended the query with IndexError (issue 8), and bytes that are not UTF-8 are among
them (the Python worker crashed on them). Checked: each bad record is in `flights-dead-letter`
with its precise reason and its raw bytes (text, or base64 when not UTF-8) and key; each copy is
reported as `duplicate event_id` with its id; the windows equal an independent pandas
computation over the flights alone (absurd times opened no window, copies counted nothing, no
flight was late: no bad record moved the watermark); events read = Σ window counts + late + dead
letters + pending, exactly.
"""

from __future__ import annotations

import base64
import json
import uuid

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from keyshift.eventtime.plausibility import TOO_FAR_AHEAD, TOO_FAR_BEHIND, TOO_FAR_IN_THE_FUTURE
from keyshift.names import DEAD_LETTER_TOPIC, LATE_TOPIC
from keyshift.processing.job_config import JobConfig
from keyshift.processing.operators.processor import DUPLICATE_EVENT_ID
from keyshift.topics import read_committed

pytestmark = pytest.mark.integration

FLIGHTS = 12_000
PARTITIONS = 4
PER_BATCH = 2_500
T = 978_307_260_000  # 2001-01-01T00:01:00Z, inside the first flights' hours


def flight(**changes) -> bytes:
    record = {"event_id": 9_000_000, "origin": "ORD", "destination": "LGA", "delay_min": 12, "distance_mi": 733, "event_time": T}
    record.update(changes)
    return json.dumps({k: v for k, v in record.items() if v is not ...}).encode()


LONG = "X" * 1_500
CORPUS = [
    # (kind, Kafka key, value, the reason the job must give)
    ("malformed JSON", b"ORD", flight()[:-9], "malformed JSON"),
    ("not JSON", b"ORD", b"hello, world", "malformed JSON"),
    ("data after the object", b"ORD", flight() + b" garbage", "malformed JSON"),
    ("empty value", b"ORD", b"", "empty value"),
    ("tombstone", b"ORD", None, "empty value"),
    ("an array", b"ORD", b"[" + flight() + b"]", "not a JSON object"),
    ("a number", b"ORD", b"42", "not a JSON object"),
    ("missing fields", b"ORD", b'{"event_id": 1, "origin": "ORD"}', "missing destination"),
    ("a null field", b"ORD", flight(origin=None), "null origin"),
    ("a string delay", b"ORD", flight(delay_min="12"), "wrong type for delay_min"),
    ("an object where a string belongs", b"ORD", flight(destination={"code": "LGA"}), "wrong type for destination"),
    ("NaN", b"ORD", flight(delay_min=0).replace(b'"delay_min": 0', b'"delay_min": NaN'), "malformed JSON"),
    ("Infinity", b"ORD", flight(distance_mi=0).replace(b'"distance_mi": 0', b'"distance_mi": -Infinity'), "malformed JSON"),
    ("a negative event time", b"ORD", flight(event_time=-5), "negative event_time"),
    ("event time 0 (1970)", b"ORD", flight(event_time=0), TOO_FAR_BEHIND),
    ("event time in 2100", b"ORD", flight(event_time=4_102_444_800_000), TOO_FAR_IN_THE_FUTURE),
    ("event time in 2010, years ahead of the stream", b"ORD", flight(event_time=1_262_304_000_000), TOO_FAR_AHEAD),
    ("a key over 1 KiB", LONG.encode(), flight(origin=LONG), "origin over 1024 bytes"),
    ("bytes that are not UTF-8", b"ORD", flight(origin="@@").replace(b"@@", b"\xff\xfe"), "invalid UTF-8"),
    ("a Kafka key that disagrees with the origin", b"ATL", flight(), "key does not match origin"),
]
COPIES = 6  # flights sent again with the same event id; one of them twice


def _read_run_records(settings, topic: str, run_id: str) -> list[dict]:
    """Committed records of `topic` whose value names `run_id` (side outputs are transactional)."""
    records = [json.loads(m.value) for m in read_committed(settings, topic)]
    return [r for r in records if r.get("run_id") == run_id]


@pytest.fixture(scope="module")
def run(stack_settings, spark):
    """Write flights, corpus and copies into a fresh topic; run the job once over all of it."""
    from kafka import KafkaProducer

    from keyshift.data.flights import flights_path
    from keyshift.data.replay import encode_values
    from keyshift.kafka_clients import client_options
    from keyshift.placement.strategies import strategy_by_name
    from keyshift.runtime.driver import run_job
    from keyshift.topics import create_topics

    settings = stack_settings
    topic = f"it-bad-input-{uuid.uuid4().hex[:8]}"
    create_topics(settings, [topic], PARTITIONS)
    flights = pd.read_parquet(flights_path(settings)).iloc[:FLIGHTS]
    values = encode_values(pa.Table.from_pandas(flights, preserve_index=False), np.arange(FLIGHTS))
    strategy = strategy_by_name("hash", PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all", **client_options(settings))
    sent: dict[tuple[int, int], tuple[str, bytes | None, bytes | None, str]] = {}  # (partition, offset) -> kind, key, value, reason
    copies: dict[tuple[int, int], int] = {}  # (partition, offset) -> event id

    def send(key, value, partition):
        metadata = producer.send(topic, key=key, value=value, partition=partition).get(timeout=30)
        return metadata.partition, metadata.offset

    def send_corpus(part: int) -> None:
        for i, (kind, key, value, reason) in enumerate(CORPUS):
            sent[send(key, value, (i + part) % PARTITIONS)] = (kind, key, value, reason)

    def send_flights(rows: range) -> None:
        for i in rows:
            origin = flights["origin"].iat[i]
            producer.send(topic, key=origin.encode(), value=values[i], partition=strategy.slot_of(origin))
        producer.flush()

    def send_copies(ids) -> None:
        for i in ids:
            origin = flights["origin"].iat[i]
            copies[send(origin.encode(), values[i], strategy.slot_of(origin))] = int(i)

    thirds = np.array_split(np.arange(FLIGHTS), 3)
    send_corpus(0)  # the 2100 record reaches batch 0, ordinary batches follow it
    send_flights(range(thirds[0][0], thirds[0][-1] + 1))
    send_copies([10, 500, 3_000, 3_500, 3_500])  # flights sent before; 3,500 twice
    send_corpus(1)
    send_flights(range(thirds[1][0], thirds[1][-1] + 1))
    send_copies([thirds[1][-1]])  # a copy right behind its original, likely in the same batch
    send_corpus(2)
    send_flights(range(thirds[2][0], thirds[2][-1] + 1))
    producer.close()
    total = FLIGHTS + 3 * len(CORPUS) + COPIES

    config = JobConfig.from_options(
        run_id=f"it-bad-{uuid.uuid4().hex[:8]}", topic=topic, partitions=PARTITIONS, limit=total,
        max_offsets_per_trigger=PER_BATCH, bound_ms=2 * 86_400_000, idle_timeout_s=240,
    )
    summary = run_job(settings, config, starting="earliest", spark=spark)
    return {
        "summary": summary, "config": config, "flights": flights, "sent": sent, "copies": copies, "total": total,
        "strategy": strategy, "run_dir": settings.runs_dir / config.run_id,
        "dead": _read_run_records(settings, DEAD_LETTER_TOPIC, config.run_id),
        "late": _read_run_records(settings, LATE_TOPIC, config.run_id),
    }


def test_the_corpus_has_every_kind_the_issue_lists():
    assert len(CORPUS) >= 15 and len({kind for kind, *_ in CORPUS}) == len(CORPUS)


def test_every_record_is_accounted_for_and_the_query_kept_running(run):
    summary = run["summary"]
    print("reconciliation:", {k: summary[k] for k in ("events_read", "sum_window_counts", "late_events", "dead_letters", "pending_events", "batches")})
    assert summary["events_read"] == run["total"]
    assert summary["dead_letters"] == 3 * len(CORPUS) + COPIES
    assert summary["late_events"] == 0 == len(run["late"])  # no bad record moved the watermark
    assert summary["sum_window_counts"] == FLIGHTS
    assert summary["pending_events"] == 0
    assert summary["events_read"] == summary["sum_window_counts"] + summary["late_events"] + summary["dead_letters"] + summary["pending_events"]
    assert summary["reconciled"] is True
    assert summary["batches"] >= run["total"] // PER_BATCH  # many micro-batches, bad records in the first, middle and last


def test_each_bad_record_is_a_dead_letter_with_its_reason_and_raw_bytes(run):
    letters = {(d["kafka_partition"], d["kafka_offset"]): d for d in run["dead"] if d["reason"] != DUPLICATE_EVENT_ID}
    assert set(letters) == set(run["sent"])  # each exactly once (the consumer reads committed records only)
    for position, (kind, key, value, reason) in run["sent"].items():
        letter = letters[position]
        assert letter["reason"] == reason, kind
        assert letter["raw_key_base64"] == base64.b64encode(key).decode(), kind
        if value is None:
            assert letter["raw_encoding"] is None and "raw_value" not in letter, kind
        elif reason == "invalid UTF-8":
            assert letter["raw_encoding"] == "base64" and "raw_value" not in letter
            assert base64.b64decode(letter["raw_value_base64"]) == value
        else:
            assert letter["raw_encoding"] == "utf-8", kind
            assert letter["raw_value"].encode() == value, kind


def test_duplicated_event_ids_are_reported_once_each_and_not_counted(run):
    duplicates = [d for d in run["dead"] if d["reason"] == DUPLICATE_EVENT_ID]
    # each copy reported, never its original: the copy with the lowest (partition, offset) is kept
    assert {(d["kafka_partition"], d["kafka_offset"]): d["event_id"] for d in duplicates} == run["copies"]
    assert len(duplicates) == COPIES
    flights = run["flights"]
    for letter in duplicates:
        original = flights.iloc[letter["event_id"]]
        assert letter["event"]["origin"] == original["origin"]
        assert letter["event"]["delay_min"] == int(original["delay"])
        assert letter["kafka_partition"] == run["strategy"].slot_of(original["origin"])


def test_windows_equal_an_independent_pandas_computation_over_the_flights_alone(run):
    flights = run["flights"]
    expected = (
        flights.assign(window_start=flights["date"].dt.floor("h").dt.tz_localize("UTC"))
        .groupby(["origin", "window_start"])["delay"]
        .agg(count="count", sum_delay_min="sum", max_delay_min="max")
        .reset_index()
        .sort_values(["origin", "window_start"])
        .reset_index(drop=True)
    )
    windows = pd.read_parquet(run["run_dir"] / "windows").sort_values(["origin", "window_start"]).reset_index(drop=True)
    assert not windows.duplicated(["origin", "window_start"]).any()
    assert windows["origin"].tolist() == expected["origin"].tolist()  # no window of a bad record's origin or time
    assert (windows["window_start"].dt.as_unit("us") == expected["window_start"].dt.as_unit("us")).all()
    for column in ("count", "sum_delay_min", "max_delay_min"):
        assert windows[column].astype("int64").tolist() == expected[column].astype("int64").tolist(), column
