"""hot_split in the real job (Kafka, Redis, Spark): split keys' windows merged equal an unsplit run.

40,000 real flights go into a fresh 4-partition topic. A hot_split assignment is published in
Redis under the topic's name that splits ORD over 2 slots and DFW over 3 (the rest placed whole
by least_count on the first 10 %). The job runs twice over the same offsets in the same
micro-batches: with that assignment, and with `hash`, where every key sits on one slot. Checked:
the windows tables are equal apart from `slot` and `epoch`, and so are the late events; the
split keys' windows really came from several slots (pieces merged in the sink, and their state
sat on each of their slots); every slot processed exactly the events the rule sends it
(slot[event_id mod k] for a split key, the map's slot otherwise).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from keyshift.names import LATE_TOPIC
from keyshift.placement.tokens import slot_tokens, stateful_partition_of_slot
from keyshift.processing.job_config import JobConfig
from keyshift.processing.operators.processor import PENDING_STATE_NAME
from keyshift.topics import read_committed

pytestmark = pytest.mark.integration

FLIGHTS = 40_000
PARTITIONS = 4
BATCH = 10_000


def _late_ids(settings, run_id: str) -> set[int]:
    import json

    ids = {json.loads(m.value)["event_id"] for m in read_committed(settings, LATE_TOPIC) if json.loads(m.value).get("run_id") == run_id}
    return ids


@pytest.fixture(scope="module")
def runs(settings, spark):
    from keyshift.data.flights import flights_path
    from keyshift.data.replay import replay_flights
    from keyshift.placement.assignment_store import AssignmentStore
    from keyshift.placement.strategies import LeastCountStrategy
    from keyshift.runtime.driver import run_job
    from keyshift.topics import create_topics, describe_topics

    topic = f"it-hot-split-{uuid.uuid4().hex[:8]}"
    create_topics(settings, [topic], PARTITIONS)
    if LATE_TOPIC not in describe_topics(settings, [LATE_TOPIC]):  # any partition count will do for the side output
        create_topics(settings, [LATE_TOPIC], 8)
    replay_flights(settings, topic, limit=FLIGHTS, strategy="hash", partitions=PARTITIONS, progress=False)
    flights = pd.read_parquet(flights_path(settings), columns=["origin"]).iloc[:FLIGHTS]

    head = flights["origin"].iloc[: FLIGHTS // 10]
    counts = head.value_counts().reindex(pd.unique(head))
    learned = LeastCountStrategy.from_counts({k: int(v) for k, v in counts.items()}, PARTITIONS)
    mapping = dict(learned.assignment)
    split = {
        "ORD": (mapping["ORD"], (mapping["ORD"] + 1) % PARTITIONS),
        "DFW": (mapping["DFW"], (mapping["DFW"] + 1) % PARTITIONS, (mapping["DFW"] + 2) % PARTITIONS),
    }
    store = AssignmentStore.from_settings(settings, topic)
    epoch = store.publish("hot_split", PARTITIONS, mapping, learned.loads, split=split)

    summaries = {}
    for strategy in ("hot_split", "hash"):
        config = JobConfig.from_options(
            run_id=f"it-{strategy.replace('_', '-')}-{uuid.uuid4().hex[:8]}", strategy=strategy, topic=topic,
            partitions=PARTITIONS, limit=FLIGHTS, max_offsets_per_trigger=BATCH, bound_ms=3_600_000, idle_timeout_s=240,
        )
        summaries[strategy] = run_job(settings, config, starting="earliest", spark=spark)
    final = store.snapshot()  # keys first seen after the first 10 % were placed by the atomic assign
    store.delete()
    assert final["epoch"] == epoch and {k: tuple(v) for k, v in final["split"].items()} == split
    return {"summaries": summaries, "split": split, "mapping": final["mapping"], "epoch": epoch, "flights": flights}


def _windows(settings, summary) -> pd.DataFrame:
    frame = pd.read_parquet(summary["windows_path"])
    return frame.sort_values(["origin", "window_start"]).reset_index(drop=True)


def test_split_windows_merged_equal_the_unsplit_run(runs, settings):
    split_summary, hash_summary = runs["summaries"]["hot_split"], runs["summaries"]["hash"]
    assert split_summary["split_keys"] == {key: list(slots) for key, slots in sorted(runs["split"].items())}
    assert split_summary["merged_window_pieces"] > 0  # the split keys' windows really came in pieces
    assert hash_summary["merged_window_pieces"] == 0
    ours, theirs = _windows(settings, split_summary), _windows(settings, hash_summary)
    assert not ours.duplicated(["origin", "window_start"]).any()
    assert len(ours) == len(theirs)
    assert set(ours["epoch"]) == {runs["epoch"]}
    pd.testing.assert_frame_equal(ours.drop(columns=["slot", "epoch"]), theirs.drop(columns=["slot", "epoch"]))


def test_both_runs_account_for_every_event_and_agree_on_late_ones(runs, settings):
    for summary in runs["summaries"].values():
        assert summary["events_read"] == FLIGHTS
        assert summary["reconciled"] is True and summary["pending_events"] == 0
    split_summary, hash_summary = runs["summaries"]["hot_split"], runs["summaries"]["hash"]
    assert split_summary["late_events"] == hash_summary["late_events"]
    assert _late_ids(settings, split_summary["run_id"]) == _late_ids(settings, hash_summary["run_id"])


def test_every_slot_processed_exactly_the_events_the_rule_sends_it(runs):
    origins = runs["flights"]["origin"].to_numpy(object)
    event_ids = np.arange(FLIGHTS)  # the replay numbers events by their row
    expected = np.zeros(PARTITIONS, dtype=np.int64)
    for origin, event_id in zip(origins, event_ids):
        slots = runs["split"].get(origin)
        expected[slots[event_id % len(slots)] if slots else runs["mapping"][origin]] += 1
    assert runs["summaries"]["hot_split"]["per_slot_events"] == expected.tolist()


def test_split_keys_state_sat_on_each_of_their_slots(runs, spark):
    state = (
        spark.read.format("statestore")
        .option("path", str(Path(runs["summaries"]["hot_split"]["windows_path"]).parent / "checkpoint"))
        .option("stateVarName", PENDING_STATE_NAME)
        .option("batchId", 0)
        .load()
        .selectExpr("key.token AS token", "user_map_key.origin AS origin", "partition_id")
        .toPandas()
    )
    stateful = runs["summaries"]["hot_split"]["stateful_partitions"]
    tokens = slot_tokens(PARTITIONS, stateful)
    token_slot = {token: slot for slot, token in enumerate(tokens)}
    assert (state["partition_id"] == [stateful_partition_of_slot(token_slot[t], PARTITIONS, stateful) for t in state["token"]]).all()
    for key, slots in runs["split"].items():
        assert {token_slot[t] for t in state.loc[state["origin"] == key, "token"]} == set(slots), key
    cold = state[~state["origin"].isin(list(runs["split"]))]
    assert len(cold) > 50
    assert (cold["token"].map(token_slot) == cold["origin"].map(runs["mapping"])).all()
