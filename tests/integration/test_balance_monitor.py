"""The balance monitor against the real stack: the Redis series, sampling a real topic, the job's
per-slot counts from a real run record, evaluations one after another, and `keyshift balance show`
from Redis and, when Redis does not answer, from the Parquet history.

Needs `keyshift stack up` (Kafka and Redis); skipped when they do not answer. Every test uses a
topic and Redis keys of its own and removes them.
"""

from __future__ import annotations

import uuid

import pytest
import redis

from keyshift import names
from keyshift.monitoring.results import LastSwitch, ResultStore
from keyshift.settings import Settings

pytestmark = pytest.mark.integration



@pytest.fixture
def client(stack_settings):
    client = redis.Redis.from_url(stack_settings.redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def topic(stack_settings, client):
    from keyshift.topics import create_topics, delete_topics

    name = f"keyshift-test-balance-{uuid.uuid4().hex[:8]}"
    create_topics(stack_settings, [name], partitions=4)
    yield name
    ResultStore(client, name).delete()
    delete_topics(stack_settings, [name])


def _send(settings: Settings, topic: str, keyed: dict[str, int], unkeyed: int = 0) -> int:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all")
    for key, count in keyed.items():
        for _ in range(count):
            producer.send(topic, key=key.encode(), value=b"{}")
    for _ in range(unkeyed):
        producer.send(topic, value=b"{}", partition=0)
    producer.flush()
    producer.close()
    return sum(keyed.values()) + unkeyed


def test_series_round_trip_keeps_the_last_n(client):
    store = ResultStore(client, f"keyshift-test-series-{uuid.uuid4().hex[:8]}", keep=3)
    try:
        assert store.latest() is None and store.recent(5) == [] and store.cursor() == {} and store.last_switch() is None
        for i in range(5):
            store.save({"at_s": 1000.0 + i, "n": i}, cursor={"end_offsets": {"0": i}})
        assert store.latest() == {"at_s": 1004.0, "n": 4}
        assert [r["n"] for r in store.recent(10)] == [2, 3, 4]  # oldest first, capped at keep
        assert [r["n"] for r in store.recent(2)] == [3, 4]
        assert store.cursor() == {"end_offsets": {"0": 4}}
        store.save({"at_s": 2000.0, "n": 5}, switch=LastSwitch(2000.0, "hash", "least_count"))
        store.record_migration(4.36)
        store.save({"at_s": 3000.0, "n": 6}, switch=LastSwitch(3000.0, "least_count", "hash"))  # no new cost measured
        assert store.last_switch() == LastSwitch(3000.0, "least_count", "hash", 4.36)
    finally:
        store.delete()


def test_sample_topic_reads_the_ranges_and_skips_unkeyed(stack_settings, topic):
    from keyshift.monitoring.loads import arrival_ranges, arrivals, bounded_ranges
    from keyshift.monitoring.sampling import Sampler
    from keyshift.monitoring.stream import read_offsets, sample_topic

    sent = _send(stack_settings, topic, {"A": 50, "B": 30, "C": 20}, unkeyed=5)
    offsets = read_offsets(stack_settings, topic)
    ranges = arrival_ranges(None, offsets.end, offsets.beginning)
    assert sum(arrivals(ranges)) == sent
    sampler = Sampler(every=1)
    sample = sample_topic(stack_settings, topic, ranges, sampler)
    assert (sample.read, sample.unkeyed) == (sent, 5)
    assert dict(sorted(sampler.counts.items())) == {"A": 50, "B": 30, "C": 20}
    bounded = Sampler(every=1)
    assert sample_topic(stack_settings, topic, bounded_ranges(ranges, 10), bounded).read == 10


def test_missing_topic_is_a_clear_error(stack_settings):
    from keyshift.errors import ConfigurationError
    from keyshift.monitoring.stream import read_offsets

    with pytest.raises(ConfigurationError, match="does not exist"):
        read_offsets(stack_settings, f"keyshift-test-absent-{uuid.uuid4().hex[:8]}")


def test_evaluations_one_after_another(stack_settings, client, topic, tmp_path):
    """Second evaluation sees only what arrived since the first; the job's counts likewise."""
    from keyshift.orchestration.monitor import evaluate_topic, monitor_params
    from keyshift.runs import RunRecorder

    settings = Settings(runs_dir=tmp_path)
    run_id = f"test-monitor-{uuid.uuid4().hex[:8]}"
    recorder = RunRecorder(settings, run_id)
    try:
        recorder.start(strategy="hash", partitions=4, topic=topic)
        recorder.progress({"batch_id": 0, "processed_rows_per_slot": [10, 20, 30, 40]})
        params = monitor_params({"topic": topic, "trigger": "threshold", "theta": 0.0, "sample_fraction": 1.0, "candidates": ["hash", "least_count"]})
        first_sent = _send(stack_settings, topic, {"A": 40, "B": 20, "C": 10, "D": 5})
        first = evaluate_topic(settings, params)["record"]
        assert first["job_run_id"] == run_id  # the latest run recorded for the topic
        assert first["measured"]["processed"]["loads"] == [10, 20, 30, 40]
        assert first["measured"]["arrivals"]["events"] == first_sent == first["evaluation"]["events"]

        recorder.progress({"batch_id": 1, "processed_rows_per_slot": [1, 1, 1, 5]})
        second_sent = _send(stack_settings, topic, {"E": 7})
        second = evaluate_topic(settings, params)["record"]
        assert second["measured"]["processed"]["loads"] == [1, 1, 1, 5]  # since the first evaluation
        assert second["measured"]["processed"]["balance_degree"] == pytest.approx(0.2)  # eq. 1: 1 / 5
        assert second["measured"]["arrivals"]["events"] == second_sent == second["evaluation"]["events"] == 7
        assert sorted(second["measured"]["arrivals"]["loads"]) == [0, 0, 0, 7]  # one key: one partition

        recorder.finish({"per_slot_events": [20, 30, 40, 50]})  # summary.json wins once the run ended
        third = evaluate_topic(settings, params)["record"]
        assert third["evaluation"] is None and third["decision"]["switch"] is False  # nothing arrived
        assert third["measured"]["processed"]["loads"] == [9, 9, 9, 5]
        assert third["measured"]["arrivals"]["events"] == 0

        series = ResultStore(client, topic).recent(10)
        assert [r["at"] for r in series] == [first["at"], second["at"], third["at"]]
        assert len(list((tmp_path / "balance" / "topics" / topic / "history").glob("*.parquet"))) == 2  # no sample, no rows
    finally:
        client.delete(names.redis_run_key(run_id), names.redis_progress_key(run_id))


def test_cost_aware_cool_down_uses_the_switch_history_in_redis(stack_settings, client, topic, tmp_path):
    import time

    from keyshift.orchestration.monitor import evaluate_topic, monitor_params

    settings = Settings(runs_dir=tmp_path)
    store = ResultStore(client, topic)
    params = monitor_params({"topic": topic, "strategy": "hash", "trigger": "cost_aware", "cost_s": 0.0, "margin": 0.0, "cooldown_s": 300.0,
                             "sample_fraction": 1.0, "candidates": ["hash", "least_count"]})
    skewed = {f"K{i}": 200 // (i + 1) + 1 for i in range(40)}
    # a switch least_count -> hash 10 s ago: going back to least_count is refused within the cool-down
    store.save({"at_s": 0.0}, switch=LastSwitch(time.time() - 10, "least_count", "hash"))
    _send(stack_settings, topic, skewed)
    refused = evaluate_topic(settings, params)
    assert refused["switch_conf"] is None and "cool-down" in refused["record"]["decision"]["reason"]
    # the same switch an hour ago: the cool-down is over and the move pays
    store.save({"at_s": 1.0}, switch=LastSwitch(time.time() - 3600, "least_count", "hash"))
    _send(stack_settings, topic, skewed)
    unread = evaluate_topic(settings, params)  # no job run reads the topic: decided, but nothing to switch
    assert unread["record"]["decision"]["switch"] is True and unread["switch_conf"] is None
    assert "no live job run reads" in unread["record"]["switch_request"]["reason"]
    assert store.last_switch().strategy_to == "hash"  # a switch not requested is not history
    from keyshift.runs import RunRecorder

    run_id = f"test-monitor-{uuid.uuid4().hex[:8]}"
    RunRecorder(settings, run_id).start(strategy="hash", partitions=4, topic=topic)  # a live run on the topic
    try:
        _send(stack_settings, topic, skewed)
        allowed = evaluate_topic(settings, params)
        assert allowed["switch_conf"]["strategy"] == "least_count" and allowed["switch_conf"]["expected_gain_s"] > 0
        assert allowed["switch_conf"]["run_id"] == run_id
        assert store.last_switch().strategy_to == "least_count"  # the requested switch is the new history
    finally:
        client.delete(names.redis_run_key(run_id))


def test_cli_show_reads_redis_then_falls_back_to_parquet(stack_settings, topic, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from keyshift.cli import _register, cli

    _register()
    monkeypatch.setenv("KEYSHIFT_RUNS_DIR", str(tmp_path))
    _send(stack_settings, topic, {f"K{i}": 100 // (i + 1) + 1 for i in range(20)})
    args = ["balance", "evaluate", "--topic", topic, "--sample-fraction", "1", "--trigger", "threshold", "--theta", "1.0",
            "--candidate", "hash", "--candidate", "least_count"]
    evaluated = CliRunner().invoke(cli, args)
    assert evaluated.exit_code == 0, evaluated.output
    assert "measured arrivals" in evaluated.output and "switch to least_count" in evaluated.output
    shown = CliRunner().invoke(cli, ["balance", "show", "--topic", topic])
    assert shown.exit_code == 0 and "(read from redis)" in shown.output and "measured arrivals" in shown.output, shown.output
    recent = CliRunner().invoke(cli, ["balance", "show", "--topic", topic, "--recent", "5"])
    assert recent.exit_code == 0 and "switch to least_count" in recent.output, recent.output
    monkeypatch.setenv("KEYSHIFT_REDIS_PORT", "1")  # Redis down: the Parquet history answers
    fallback = CliRunner().invoke(cli, ["balance", "show", "--topic", topic])
    assert fallback.exit_code == 0 and "(read from parquet (Redis does not answer))" in fallback.output, fallback.output
    assert "switch to least_count" in fallback.output, fallback.output
    nothing = CliRunner().invoke(cli, ["balance", "show", "--topic", "keyshift-never-monitored"])
    assert nothing.exit_code != 0 and "keyshift stack up" in str(nothing.exception), nothing.exception
    assert "the Parquet history holds nothing either" in str(nothing.exception)
    monkeypatch.delenv("KEYSHIFT_REDIS_PORT")  # Redis back: a topic never evaluated names the command that does
    missing = CliRunner().invoke(cli, ["balance", "show", "--topic", "keyshift-never-monitored"])
    assert missing.exit_code != 0 and "keyshift balance evaluate --topic keyshift-never-monitored" in str(missing.exception)


def test_learned_strategy_in_force_is_scored_with_its_published_map(stack_settings, topic, tmp_path):
    """least_count in force is scored with the map published in Redis, not one rebuilt from the sample."""
    from keyshift.orchestration.monitor import evaluate_topic, monitor_params
    from keyshift.placement.assignment_store import AssignmentStore

    settings = Settings(runs_dir=tmp_path)
    store = AssignmentStore.from_settings(settings, topic)
    store.publish("least_count", 4, {"A": 0, "B": 0, "C": 0, "D": 0}, [100, 0, 0, 0])  # a bad map: all on slot 0
    try:
        _send(stack_settings, topic, {"A": 40, "B": 30, "C": 20, "D": 10, "E": 5})
        params = monitor_params({"topic": topic, "strategy": "least_count", "trigger": "threshold", "theta": 0.5,
                                 "sample_fraction": 1.0, "candidates": ["hash", "least_count"]})
        record = evaluate_topic(settings, params, save=False)["record"]
        assert record["in_force_assignment"] == "published epoch 1"
        least = next(r for r in record["evaluation"]["results"] if r["strategy"] == "least_count")
        assert least["in_force"] and list(least["loads"]) == [100, 5, 0, 0]  # E, new to the map, went to the least-loaded slot
        assert least["balance_degree"] == 0.0  # eq. 1: min/max; rebuilt from the sample it would be near 1
        assert store.snapshot()["mapping"] == {"A": 0, "B": 0, "C": 0, "D": 0}  # scoring wrote nothing to Redis
    finally:
        store.delete()
