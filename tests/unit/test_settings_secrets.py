"""Passwords never go where settings are stored (an Airflow trigger's kwargs), yet come back."""

from __future__ import annotations

import json

from keyshift.settings import Settings


def test_without_secrets_leaves_out_every_password_and_the_environment_gives_them_back(monkeypatch):
    monkeypatch.setenv("KEYSHIFT_REDIS_PASSWORD", "redis-s3cret")
    monkeypatch.setenv("KEYSHIFT_KAFKA_SASL_USERNAME", "keyshift")
    monkeypatch.setenv("KEYSHIFT_KAFKA_SASL_PASSWORD", "kafka-s3cret")
    monkeypatch.setenv("KEYSHIFT_AIRFLOW_PASSWORD", "airflow-s3cret")
    monkeypatch.setenv("KEYSHIFT_S3_SECRET_KEY", "s3-s3cret")
    stored = json.dumps(Settings().without_secrets())
    assert "s3cret" not in stored
    rebuilt = Settings(**json.loads(stored))
    assert rebuilt.redis_password.get_secret_value() == "redis-s3cret"
    assert rebuilt.kafka_sasl_password.get_secret_value() == "kafka-s3cret"
    assert rebuilt.airflow_password.get_secret_value() == "airflow-s3cret"
    assert rebuilt.s3_secret_key.get_secret_value() == "s3-s3cret"


def test_the_watch_sensor_defers_with_a_trigger_that_holds_no_password(monkeypatch):
    from keyshift.orchestration.sensors import JobProgressSensor

    monkeypatch.setenv("KEYSHIFT_REDIS_PASSWORD", "redis-s3cret")
    deferred = {}

    def defer(self, *, trigger, **kwargs):
        deferred["trigger"] = trigger

    monkeypatch.setattr(JobProgressSensor, "defer", defer)
    JobProgressSensor(task_id="watch_job", run_id="r1").execute({})
    assert "s3cret" not in json.dumps(deferred["trigger"].serialize()[1])
