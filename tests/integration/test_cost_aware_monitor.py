"""The monitor's cost_aware defaults against the real stack (issue 33): the horizon is the DAG's
schedule, the cost a measured pause read from the switch records in Redis, both named in the reason.

Switch records are written as keyshift writes them (`SwitchControl.save` / `conclude`, then the
topic's last switch as the driver records it when a switch is done); they belong to runs of
other topics than the evaluated one, except where the topic's own switch is the point. Needs
`keyshift stack up` (Kafka and Redis); skipped when they do not answer. Every test uses a topic
and Redis keys of its own and removes them.
"""

from __future__ import annotations

import uuid

import pytest
import redis

from keyshift import names
from keyshift.monitoring.results import ResultStore
from keyshift.monitoring.switch_policies import RECENT_SWITCHES
from keyshift.settings import Settings

pytestmark = pytest.mark.integration

OTHER_PAUSE_S = 12.4
"""Pause of the measured switches of other topics (but one outlier): their median."""


@pytest.fixture
def client(stack_settings):
    client = redis.Redis.from_url(stack_settings.redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def topic(stack_settings, client):
    """A fresh 4-partition topic holding a skewed stream (hash max/mean well above least_count's)."""
    from kafka import KafkaProducer

    from keyshift.topics import create_topics, delete_topics

    name = f"keyshift-test-costaware-{uuid.uuid4().hex[:8]}"
    create_topics(stack_settings, [name], partitions=4)
    producer = KafkaProducer(bootstrap_servers=stack_settings.bootstrap_servers, acks="all")
    for i in range(40):
        for _ in range(200 // (i + 1) + 1):
            producer.send(name, key=f"K{i}".encode(), value=b"{}")
    producer.flush()
    producer.close()
    yield name
    ResultStore(client, name).delete()
    delete_topics(stack_settings, [name])


@pytest.fixture
def switches(client):
    """`write(topic, pause_s, state="done") -> record`: one finished switch of a run of its own, written by `SwitchControl`."""
    from keyshift.migration.switch import SwitchControl
    from keyshift.migration.switch_record import SwitchRecord

    runs: list[str] = []

    def write(on_topic: str, pause_s: float, state: str = "done") -> SwitchRecord:
        run_id = f"it-costaware-{uuid.uuid4().hex[:8]}"
        runs.append(run_id)
        control = SwitchControl(client, run_id)
        record = SwitchRecord(switch_id=f"sw-it-{uuid.uuid4().hex[:6]}", run_id=run_id, topic=on_topic, strategy_from="hash",
                              strategy_to="least_count", partitions_from=4, partitions_to=4, epoch_from=0, epoch_to=1, reason="test",
                              step="verified", migration={"state_bytes_moved": 0})
        control.save(record)
        if state == "done":
            record = control.advance(record, "verified", 1.0, pause_seconds=pause_s)
            record = control.advance(record, "done")
        return control.conclude(record, state, **({} if state == "done" else {"pause_seconds": pause_s, "error": "test"}))

    yield write
    for run_id in runs:
        control = SwitchControl(client, run_id)
        client.delete(control.record_key, control.history_key, control.lock_key)


def _params(topic: str, **given):
    from keyshift.orchestration.monitor import monitor_params

    return monitor_params({"topic": topic, "strategy": "hash", "trigger": "cost_aware", "sample_fraction": 1.0,
                           "candidates": ["hash", "least_count"], **given})


def _gain_over(record: dict, horizon_s: float) -> float:
    results = {r["strategy"]: r for r in record["evaluation"]["results"]}
    return horizon_s * (1 - results["least_count"]["max_over_mean"] / results["hash"]["max_over_mean"])


def test_cost_default_is_the_median_pause_of_other_topics_switches(stack_settings, topic, switches, tmp_path):
    from keyshift.orchestration.monitor import evaluate_topic

    other = f"keyshift-test-costaware-other-{uuid.uuid4().hex[:6]}"
    for _ in range(RECENT_SWITCHES - 1):
        switches(other, OTHER_PAUSE_S)
    switches(other, 60.0)  # one slow switch: the median ignores it (the mean would be 14.18 s)
    switches(other, 999.0, state="rolled_back")  # newest, but not a measured switch: not counted

    record = evaluate_topic(Settings(runs_dir=tmp_path), _params(topic), save=False)["record"]
    decision = record["decision"]
    assert (record["horizon_s"], record["horizon_source"]) == (600.0, "the monitor's 10-min schedule")
    assert record["cost_s"] == OTHER_PAUSE_S
    assert record["cost_source"].startswith(f"median pause of {RECENT_SWITCHES} measured switches")
    assert "horizon 600 s = the monitor's 10-min schedule" in decision["reason"]
    assert f"cost 12.40 s = median pause of {RECENT_SWITCHES} measured switches" in decision["reason"]
    assert decision["expected_gain_s"] == pytest.approx(_gain_over(record, 600.0))
    assert decision["switch"] and decision["strategy"] == "least_count"  # the skew pays over 10 minutes

    # set by the user: kept, and said so
    given = evaluate_topic(Settings(runs_dir=tmp_path), _params(topic, horizon_s=60.0, cost_s=3.0), save=False)["record"]
    assert "horizon 60 s = horizon_s as set" in given["decision"]["reason"]
    assert "cost 3.00 s = cost_s as set, no switch measured on the topic" in given["decision"]["reason"]
    assert given["decision"]["expected_gain_s"] == pytest.approx(_gain_over(given, 60.0))


def test_the_topics_last_measured_switch_sets_the_cost_with_its_id(stack_settings, client, topic, switches, tmp_path):
    from keyshift.migration.in_driver import _record_cost
    from keyshift.orchestration.monitor import evaluate_topic

    other = f"keyshift-test-costaware-other-{uuid.uuid4().hex[:6]}"
    for _ in range(3):
        switches(other, OTHER_PAUSE_S)
    ours = switches(topic, 9.8)
    _record_cost(stack_settings, ours)  # what the driver does once a switch is done: the topic's last switch and its pause
    assert client.hget(names.redis_balance_switch_key(topic), "migration_s") == repr(9.8)

    record = evaluate_topic(Settings(runs_dir=tmp_path), _params(topic, cost_s=3.0), save=False)["record"]
    assert record["cost_s"] == 9.8  # the topic's own measurement wins over cost_s and over other topics' median
    assert f"cost 9.80 s = the topic's last measured switch {ours.switch_id} (its pause)" in record["decision"]["reason"]
