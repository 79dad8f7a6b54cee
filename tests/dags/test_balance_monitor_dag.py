"""The keyshift_balance_monitor and keyshift_switch DAGs.

Pure tests (no services): the DAGs' wiring, schedule and params, and the short-circuit task.

Integration tests (`-m integration`, need `keyshift stack up`; skipped when Kafka or Redis does
not answer): `dag.test()` of `keyshift_balance_monitor` on a topic of its own in the real Kafka
with the real Redis and run records written there, once with a trigger that must switch
(threshold θ = 1.0 on a skewed stream: the `keyshift_switch` run exists in Airflow's database
with the decision as its conf; `dag.test()` of `keyshift_switch` with that conf, once the run has
stopped, skips it and the reason lands in the monitor's record), once with two live runs and a
finished one on the topic (both live runs evaluated, one switched, the other skipped), and once
with a trigger that must stay (θ = 0.0: no `keyshift_switch` run). The switch of a
running job through the running Airflow is `tests/integration/test_airflow_switch.py`.
"""

from __future__ import annotations

import copy
import json
import shutil
import os
import subprocess
import sys
import textwrap
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from keyshift import names
from keyshift.settings import Settings

REPO = Path(__file__).resolve().parents[2]
DAGS_DIR = REPO / "dags"


@pytest.fixture(scope="module")
def bag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS_DIR))
    assert not bag.import_errors, bag.import_errors
    return bag


def test_monitor_dag_shape_and_schedule(bag):
    dag = bag.dags[names.BALANCE_MONITOR_DAG_ID]
    upstream = {t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks}
    assert upstream == {"live_runs": [], "evaluate": ["live_runs"], "switches_decided": ["evaluate"],
                        "all_evaluated": ["evaluate", "live_runs"], "trigger_switch": ["switches_decided"]}
    assert dag.task_dict["switches_decided"].trigger_rule == dag.task_dict["all_evaluated"].trigger_rule == "all_done"
    assert dag.schedule == timedelta(seconds=Settings().monitor_interval_s)
    assert dag.max_active_runs == 1 and dag.catchup is False
    evaluate, trigger = dag.task_dict["evaluate"], dag.task_dict["trigger_switch"]
    assert evaluate.map_index_template == "{{ evaluated }}"  # one mapped instance per run, named after it
    assert trigger.partial_kwargs["trigger_dag_id"] == names.SWITCH_DAG_ID and trigger.partial_kwargs["wait_for_completion"] is False


def test_monitor_schedule_follows_the_setting():
    from keyshift.orchestration.monitor import EVALUATION_INTERVAL, evaluation_interval

    assert Settings.model_fields["monitor_interval_s"].default == EVALUATION_INTERVAL.total_seconds() == 600  # the default
    assert evaluation_interval(Settings(monitor_interval_s=600)) == EVALUATION_INTERVAL == timedelta(minutes=10)
    assert evaluation_interval(Settings(monitor_interval_s=45)) == timedelta(seconds=45)  # a test stack's


def test_monitor_dag_params_are_valid_monitor_params(bag):
    from keyshift.orchestration.monitor import DEFAULT_CANDIDATES, monitor_params

    params = bag.dags[names.BALANCE_MONITOR_DAG_ID].params.dump()
    assert params["topic"] is None and params["run_id"] is None and params["trigger"] == "cost_aware"  # every live run
    assert params["candidates"] == list(DEFAULT_CANDIDATES)
    parsed = monitor_params(params)  # the form's defaults are accepted as they are
    assert parsed.partitions is None and parsed.sample_every is None and parsed.sample_fraction == 0.1


@pytest.mark.parametrize(
    "job, given, scored",
    [
        ("ysb", None, ("hash", "least_key", "least_count")),  # the defaults, less what YSB cannot run (modulo, hot_split)
        ("flight_delays", None, ("hash", "modulo", "least_key", "least_count", "hot_split")),  # every default
        (None, ["hash", "hot_split"], ("hash", "hot_split")),  # a record without a job: the form's candidates as given
        ("ysb", ["hot_split"], ("hash", "least_key", "least_count")),  # none runnable: the job's own
    ],
)
def test_each_run_is_scored_on_the_strategies_its_job_runs(monkeypatch, job, given, scored):
    from keyshift.orchestration import monitor

    seen = {}
    monkeypatch.setattr(monitor, "evaluate_topic", lambda settings, params, **kw: seen.setdefault("params", params))
    target = {"topic": "ysb-ad-events", "run_id": "r1", "job": job, "label": "r1 on ysb-ad-events"}
    monitor.evaluate_target(Settings(), {"candidates": given, "topic": None}, target)
    assert seen["params"].candidates == scored and seen["params"].run_id == "r1" and seen["params"].topic == "ysb-ad-events"


def _run(state: str = "running", strategy: str = "hash", partitions: int = 8):
    from keyshift.runs import RunRecord

    return RunRecord(run_id="r1", topic="flights", state=state, strategy=strategy, partitions=partitions)


@pytest.mark.parametrize(
    "run, strategy_from, partitions_from, reason",
    [
        (_run(), "hash", 8, None),  # as decided: the switch goes ahead
        (_run(), None, None, None),  # a decision that names no placement is not checked against one
        (None, "hash", 8, "has no record in Redis"),  # the record expired or was deleted
        (_run("stopped"), "hash", 8, "is stopped, not running"),  # finished since the decision
        (_run("restarting"), "hash", 8, "is restarting, not running"),  # live, but no query to cut now
        (_run(strategy="least_count"), "hash", 8, "strategy was 'hash' and is now 'least_count'"),  # switched since
        (_run(partitions=12), "hash", 8, "P was 8 and is now 12"),  # rescaled since
    ],
)
def test_skip_reason(run, strategy_from, partitions_from, reason):
    from keyshift.orchestration.monitor import skip_reason

    found = skip_reason(run, "r1", strategy_from, partitions_from)
    assert found is None if reason is None else reason in found


def test_switch_dag_records_then_switches(bag):
    dag = bag.dags[names.SWITCH_DAG_ID]
    upstream = {t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks}
    assert dag.schedule is None and upstream == {"record_request": [], "switch": ["record_request"]}
    assert "request_switch" in dag.doc_md and "later issue" not in dag.doc_md
    assert dag.task_dict["switch"].execution_timeout is not None


def test_switch_dag_params_take_the_monitors_conf_and_the_trigger_form(bag):
    from keyshift.orchestration.monitor import SwitchRequest

    params = bag.dags[names.SWITCH_DAG_ID].params
    assert set(params.dump()) == set(SwitchRequest.model_fields)  # every conf field has a form field, and no other
    form = params.dump()
    assert form["run_id"] is None and form["partitions"] is None and form["trigger"] == "manual"
    SwitchRequest(**form)  # the form's defaults are a valid request by hand (the run is filled in later)
    conf = {"topic": "flights", "run_id": "r1", "strategy_from": "hash", "strategy": "least_count", "partitions_from": 8,
            "partitions": 8, "reason": "threshold: 0.29 < 0.6", "expected_gain_s": 24.5, "trigger": "threshold",
            "decided_at": "2026-01-01T00:00:00+00:00", "monitor_run_id": "scheduled__2026-01-01"}
    merged = copy.deepcopy(params)
    merged.update(conf)  # each value is checked against its param's schema
    assert merged.validate()["partitions_from"] == 8  # the monitor's conf passes the form


# ---------------------------------------------------------------- integration



# dag.test() needs a metadata database: a fresh interpreter with its own AIRFLOW_HOME (SQLite),
# so the running Airflow's database is never touched. dag.test() syncs the dags folder, so
# keyshift_switch exists there and the trigger can create its run.
_DAG_TEST = textwrap.dedent(
    """
    import json, sys
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    bag = DagBag(dag_folder=sys.argv[1])
    dag = bag.dags[sys.argv[2]]
    run = dag.test(run_conf=json.loads(sys.argv[3]))
    with create_session() as session:
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances(session=session)}
        switch_runs = [
            {"run_id": r.run_id, "conf": r.conf, "run_type": str(r.run_type)}
            for r in session.query(DagRun).filter(DagRun.dag_id == "keyshift_switch").all()
        ]
    xcom = None
    ti = next(t for t in run.get_task_instances() if t.task_id == sys.argv[4])
    from airflow.models.xcom import XComModel
    with create_session() as session:
        row = session.query(XComModel).filter_by(dag_id=dag.dag_id, run_id=run.run_id, task_id=sys.argv[4], key="return_value").first()
        xcom = row.value if row is not None else None
    print("RESULT " + json.dumps({"state": str(run.state), "run_id": run.run_id, "tasks": states,
                                  "switch_runs": switch_runs, "xcom": xcom}, default=str))
    """
)


@pytest.fixture(scope="module")
def airflow_env(stack_settings, tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_DIR),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "KEYSHIFT_RUNS_DIR": str(home / "runs"),
    }
    migrate = subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    return env


def _dag_test(env: dict, dag_id: str, conf: dict, task_id: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _DAG_TEST, str(DAGS_DIR), dag_id, json.dumps(conf), task_id],
                          env=env, capture_output=True, text=True, timeout=300, cwd=env["AIRFLOW_HOME"])
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"dag.test() of {dag_id} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def _skewed_records(settings: Settings, topic: str, scale: int = 1) -> int:
    """Send 40 keys with Zipf-like counts (K0 most) through kafka-python's default partitioner (murmur2 = hash)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all")
    sent = 0
    for i in range(40):
        for _ in range(scale * (200 // (i + 1) + 1)):
            producer.send(topic, key=f"K{i}".encode(), value=b"{}")
            sent += 1
    producer.flush()
    producer.close()
    return sent


@pytest.fixture
def topic(stack_settings):
    import redis

    from keyshift.monitoring.results import ResultStore
    from keyshift.topics import create_topics, delete_topics

    name = f"keyshift-test-monitor-{uuid.uuid4().hex[:8]}"
    create_topics(stack_settings, [name], partitions=4)
    yield name
    client = redis.Redis.from_url(stack_settings.redis_url, decode_responses=True)
    ResultStore(client, name).delete()
    client.delete(names.redis_switch_requests_key(name), names.redis_run_key(f"{name}-run"))
    delete_topics(stack_settings, [name])


BASE_CONF = {"sample_fraction": 1.0, "candidates": ["hash", "least_count"], "strategy": "hash"}


def _live_run(settings: Settings, topic: str, run_id: str, partitions: int = 4, started_at: float = 1.0) -> str:
    """A run record in the real Redis: a running hash job on `topic` (no job behind it: nothing here switches it)."""
    import redis

    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    client.hset(names.redis_run_key(run_id), mapping={"run_id": run_id, "topic": topic, "state": "running", "strategy": "hash",
                                                      "partitions": str(partitions), "started_at": str(started_at)})
    client.close()
    return run_id


def _series(settings: Settings, topic: str) -> list[dict]:
    import redis

    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        return [json.loads(m) for m in client.zrange(names.redis_balance_series_key(topic), 0, -1)]
    finally:
        client.close()


@pytest.mark.integration
def test_dag_test_switch_decision_triggers_keyshift_switch(airflow_env, stack_settings, topic):
    import redis

    sent = _skewed_records(stack_settings, topic)
    run_id = _live_run(stack_settings, topic, f"{topic}-run")
    result = _dag_test(airflow_env, names.BALANCE_MONITOR_DAG_ID, {**BASE_CONF, "topic": topic, "trigger": "threshold", "theta": 1.0}, "evaluate")
    assert result["state"] == "success", result
    assert result["tasks"] == {"live_runs": "success", "evaluate": "success", "switches_decided": "success", "all_evaluated": "success",
                               "trigger_switch": "success"}
    record, conf = result["xcom"]["record"], result["xcom"]["switch_conf"]
    assert record["events_arrived"] == sent and record["measured"]["arrivals"]["events"] == sent and record["job_run_id"] == run_id
    assert conf["strategy"] == "least_count" and conf["strategy_from"] == "hash" and conf["topic"] == topic and conf["run_id"] == run_id
    assert conf["monitor_run_id"] == result["run_id"] and conf["expected_gain_s"] > 0
    ours = [r for r in result["switch_runs"] if (r["conf"] or {}).get("topic") == topic]
    assert len(ours) == 1, result["switch_runs"]
    assert ours[0]["conf"] == conf and "operator" in ours[0]["run_type"].lower()

    client = redis.Redis.from_url(stack_settings.redis_url, decode_responses=True)
    latest = json.loads(client.get(names.redis_balance_latest_key(topic)))
    assert latest["decision"]["switch"] is True and latest["decision"]["strategy"] == "least_count"
    assert latest["switch_request"]["state"] == "requested"  # switches_decided noted it in the monitor's record
    assert client.hget(names.redis_balance_switch_key(topic), "strategy_to") == "least_count"
    assert client.exists(names.redis_balance_cursor_key(topic, run_id))  # the run's own cursor

    # the run stopped before keyshift_switch got to it: the decision is skipped, not failed, and says why
    client.hset(names.redis_run_key(run_id), "state", "stopped")
    switched = _dag_test(airflow_env, names.SWITCH_DAG_ID, conf, "record_request")
    assert switched["state"] == "success" and switched["tasks"] == {"record_request": "skipped", "switch": "skipped"}, switched
    assert client.llen(names.redis_switch_requests_key(topic)) == 0
    noted = json.loads(client.get(names.redis_balance_latest_key(topic)))["switch_request"]
    assert noted["state"] == "skipped" and f"run {run_id} is stopped, not running" in noted["reason"], noted
    assert [r["switch_request"]["state"] for r in _series(stack_settings, topic)] == ["skipped"]
    client.close()


@pytest.mark.integration
def test_monitor_evaluates_every_live_run_and_switches_one_per_topic(airflow_env, stack_settings, topic):
    """Two live runs on one topic, a finished one, and a live one whose topic is gone: both live
    runs on the topic are evaluated (mapped instances), the finished one is not; both decide to
    switch, one is triggered, the other is skipped with the reason in its record; the evaluation
    that failed does not hold that switch, and fails the monitor's run (`all_evaluated`)."""
    import redis

    sent = _skewed_records(stack_settings, topic)
    first, second = _live_run(stack_settings, topic, f"{topic}-a", started_at=1.0), _live_run(stack_settings, topic, f"{topic}-b", started_at=2.0)
    broken = _live_run(stack_settings, f"{topic}-deleted", f"{topic}-broken", started_at=0.5)  # its topic does not exist
    client = redis.Redis.from_url(stack_settings.redis_url, decode_responses=True)
    finished = f"{topic}-done"
    client.hset(names.redis_run_key(finished), mapping={"run_id": finished, "topic": topic, "state": "succeeded", "strategy": "hash",
                                                         "partitions": "4", "started_at": "3.0"})
    try:
        # no topic: the schedule's form (every live run keyshift knows; other tests' runs may be live too)
        result = _dag_test(airflow_env, names.BALANCE_MONITOR_DAG_ID, {**BASE_CONF, "trigger": "threshold", "theta": 1.0}, "evaluate")
        assert result["state"] == "failed", result  # the broken run's evaluation
        assert {k: result["tasks"][k] for k in ("switches_decided", "trigger_switch", "all_evaluated")} == \
            {"switches_decided": "success", "trigger_switch": "success", "all_evaluated": "failed"}, result["tasks"]
        records = {r["job_run_id"]: r for r in _series(stack_settings, topic)}
        assert set(records) == {first, second}  # the finished run is not evaluated
        assert all(r["events_arrived"] == sent and r["decision"]["switch"] for r in records.values())  # each from its own cursor
        ours = [r["conf"] for r in result["switch_runs"] if (r["conf"] or {}).get("topic") == topic]
        assert len(ours) == 1 and ours[0]["run_id"] in (first, second), ours
        other = second if ours[0]["run_id"] == first else first
        assert records[ours[0]["run_id"]]["switch_request"]["state"] == "requested"
        skipped = records[other]["switch_request"]
        assert skipped["state"] == "skipped" and f"run {ours[0]['run_id']} on the same topic" in skipped["reason"], skipped
        last = client.hgetall(names.redis_balance_switch_key(topic))  # the requested switch alone is the topic's last
        assert (last["strategy_to"], float(last["at_s"])) == (ours[0]["strategy"], records[ours[0]["run_id"]]["at_s"]), last
    finally:
        client.delete(*(names.redis_run_key(r) for r in (first, second, finished, broken)))
        client.close()


@pytest.mark.integration
def test_dag_test_stay_decision_triggers_nothing(airflow_env, stack_settings, topic):
    sent = _skewed_records(stack_settings, topic)
    result = _dag_test(airflow_env, names.BALANCE_MONITOR_DAG_ID, {**BASE_CONF, "topic": topic, "trigger": "threshold", "theta": 0.0}, "evaluate")
    assert result["state"] == "success", result
    assert result["tasks"] == {"live_runs": "success", "evaluate": "success", "switches_decided": "success", "all_evaluated": "success",
                               "trigger_switch": "skipped"}
    record = result["xcom"]["record"]
    assert record["events_sampled"] == sent and record["decision"]["switch"] is False and record["decision"]["strategy"] == "hash"
    assert result["xcom"]["switch_conf"] is None
    assert not [r for r in result["switch_runs"] if (r["conf"] or {}).get("topic") == topic]


@pytest.mark.integration
def test_switch_dag_refuses_a_bad_conf(airflow_env, stack_settings):
    bad = {"topic": "flights", "strategy": "hash", "strategy_from": "hash", "partitions": 4, "partitions_from": 4,
           "reason": "nothing changes", "expected_gain_s": 1.0, "trigger": "threshold", "decided_at": "2026-01-01T00:00:00+00:00"}
    result = _dag_test(airflow_env, names.SWITCH_DAG_ID, bad, "record_request")
    assert result["state"] == "failed" and result["tasks"] == {"record_request": "failed", "switch": "upstream_failed"}


# ------------------------------------------------ record_request: the run and what is in force, against the real Redis


@pytest.fixture
def run_records(stack_settings):
    """Write run records in the real Redis on a topic of their own (no Kafka needed); removed after."""
    import redis

    client = redis.Redis.from_url(stack_settings.redis_url, decode_responses=True)
    topic, written = f"keyshift-test-switch-{uuid.uuid4().hex[:8]}", []

    def write(state: str, strategy: str = "hash", partitions: int = 8, started_at: float = 1.0) -> str:
        run_id = f"{topic}-{len(written)}"
        client.hset(names.redis_run_key(run_id), mapping={"run_id": run_id, "topic": topic, "state": state, "strategy": strategy,
                                                          "partitions": str(partitions), "started_at": str(started_at)})
        if state == "running":  # a run whose query started has its job record (a switch before that is refused)
            (stack_settings.runs_dir / run_id).mkdir(parents=True, exist_ok=True)
            (stack_settings.runs_dir / run_id / "job.json").write_text("{}")
        written.append(run_id)
        return run_id

    yield topic, write, client
    for run_id in written:
        shutil.rmtree(stack_settings.runs_dir / run_id, ignore_errors=True)
        client.delete(names.redis_run_key(run_id), names.redis_switch_record_key(run_id))
    client.delete(names.redis_switch_requests_key(topic))
    client.close()


MONITOR_CONF = {"strategy_from": "hash", "strategy": "least_count", "partitions_from": 8, "partitions": 8, "reason": "threshold: 0.29 < 0.6",
                "expected_gain_s": 24.5, "trigger": "threshold", "decided_at": "2026-01-01T00:00:00+00:00", "monitor_run_id": "m1"}


@pytest.mark.integration
def test_record_request_names_the_latest_run_and_records_it(stack_settings, run_records):
    from keyshift.orchestration.monitor import record_switch_request

    topic, write, client = run_records
    write("stopped", started_at=1.0)
    running = write("running", started_at=2.0)
    stored = record_switch_request(stack_settings, {**MONITOR_CONF, "topic": topic, "run_id": None}, dag_run_id="d1")
    assert (stored["run_id"], stored["state"], stored["dag_run_id"]) == (running, "requested", "d1")
    assert stored["switch_record_key"] == names.redis_switch_record_key(running)
    assert json.loads(client.lindex(names.redis_switch_requests_key(topic), 0)) == stored

    # by hand: only the strategy (and P); what is in force comes from the run
    by_hand = record_switch_request(stack_settings, {"topic": topic, "strategy": "hash", "partitions": 12, "reason": "more slots"})
    assert (by_hand["strategy_from"], by_hand["partitions_from"], by_hand["partitions"], by_hand["trigger"]) == ("hash", 8, 12, "manual")
    assert by_hand["decided_at"] and client.llen(names.redis_switch_requests_key(topic)) == 2


@pytest.mark.integration
@pytest.mark.parametrize(
    "case, match",
    [
        ("stale", "stale switch request"),  # the run switched to least_count since the decision (SwitchSkipped)
        ("stopped", "is stopped, not running"),  # a monitor's decision for a run that stopped since (SwitchSkipped)
        ("no run", "no job run on topic"),
        ("under way", "is under way"),
        ("no change", "nothing to switch"),  # by hand: the strategy and P already in force
    ],
)
def test_record_request_refuses(stack_settings, run_records, case, match):
    from keyshift.errors import ConfigurationError
    from keyshift.orchestration.monitor import record_switch_request

    topic, write, client = run_records
    conf = {**MONITOR_CONF, "topic": topic}
    if case == "stale":
        write("running", strategy="least_count")
    elif case == "stopped":
        conf["run_id"] = write("stopped")
    elif case == "under way":
        run_id = write("running")
        from keyshift.migration.switch_record import SwitchRecord

        record = SwitchRecord(switch_id="sw-1", run_id=run_id, topic=topic, strategy_from="hash", strategy_to="hot_split",
                              partitions_from=8, partitions_to=8, epoch_from=0, epoch_to=1, state="running", step="stopped")
        client.set(names.redis_switch_record_key(run_id), json.dumps(record.as_json()))
    elif case == "no change":
        write("running", strategy="least_count")
        conf = {"topic": topic, "strategy": "least_count", "reason": "by hand"}
    with pytest.raises(ConfigurationError, match=match):
        record_switch_request(stack_settings, conf)
    assert client.llen(names.redis_switch_requests_key(topic)) == 0
