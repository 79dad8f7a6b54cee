"""Names defined once: Kafka topics, Redis keys, Airflow DAG ids and asset-like paths.

Every other module imports these rather than spelling a name again.
"""

# Kafka topics of the flight delay job.
FLIGHTS_TOPIC = "flights"
DEAD_LETTER_TOPIC = "flights-dead-letter"
LATE_TOPIC = "flights-late"
ALERTS_TOPIC = "flight-delay-alerts"
FLIGHT_TOPICS = (FLIGHTS_TOPIC, DEAD_LETTER_TOPIC, LATE_TOPIC, ALERTS_TOPIC)

# Airflow DAG ids.
PIPELINE_DAG_ID = "keyshift_pipeline"

# Redis keys (all under one prefix so `keyshift stack status` can count them).
REDIS_PREFIX = "keyshift"


def redis_run_key(run_id: str) -> str:
    """Redis hash holding a run record (driver pid, state, log path, summary path)."""
    return f"{REDIS_PREFIX}:run:{run_id}"


def redis_progress_key(run_id: str) -> str:
    """Redis hash holding a run's latest per-batch progress record (JSON in field `latest`)."""
    return f"{REDIS_PREFIX}:run:{run_id}:progress"


def redis_replay_key(topic: str) -> str:
    """Redis hash holding the last replay's record for a topic (events produced, end offsets)."""
    return f"{REDIS_PREFIX}:replay:{topic}"
