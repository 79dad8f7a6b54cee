"""Names defined once: Kafka topics, Redis keys, Airflow DAG ids and asset-like paths.

Every other module imports these rather than spelling a name again. The topic names and the Redis
prefix are read from `infra/stack.env` (`keyshift.stack_env`), the file docker-compose.yml gives
its containers, and only from there: no environment variable overrides them, so every process of
a deployment uses the same names.
"""

from keyshift.stack_env import stack_value

# Kafka topics of the flight delay job.
FLIGHTS_TOPIC = stack_value("KEYSHIFT_FLIGHTS_TOPIC")
DEAD_LETTER_TOPIC = stack_value("KEYSHIFT_DEAD_LETTER_TOPIC")
LATE_TOPIC = stack_value("KEYSHIFT_LATE_TOPIC")
ALERTS_TOPIC = stack_value("KEYSHIFT_ALERTS_TOPIC")
FLIGHT_TOPICS = (FLIGHTS_TOPIC, DEAD_LETTER_TOPIC, LATE_TOPIC, ALERTS_TOPIC)

# Kafka topics of the Yahoo Streaming Benchmark (keyshift.data.ysb writes the first; the YSB job
# will send its dead letters and late events to the other two).
YSB_TOPIC = stack_value("KEYSHIFT_YSB_TOPIC")
YSB_DEAD_LETTER_TOPIC = stack_value("KEYSHIFT_YSB_DEAD_LETTER_TOPIC")
YSB_LATE_TOPIC = stack_value("KEYSHIFT_YSB_LATE_TOPIC")
YSB_TOPICS = (YSB_TOPIC, YSB_DEAD_LETTER_TOPIC, YSB_LATE_TOPIC)

SINK_COMMITS_TOPIC = stack_value("KEYSHIFT_SINK_COMMITS_TOPIC")
"""The topic whose partition 0 carries, per run, the consumer-group offset that a side-output
transaction commits with its records (last committed batch id + 1; see
`keyshift.processing.outputs.side_outputs`). Nothing is written to it: only group offsets refer to it."""

# Airflow DAG ids.
PIPELINE_DAG_ID = "keyshift_pipeline"

# Redis keys (all under one prefix so `keyshift stack status` can count them).
REDIS_PREFIX = stack_value("KEYSHIFT_REDIS_PREFIX")


def redis_run_key(run_id: str) -> str:
    """Redis hash holding a run record (driver pid, state, log path, summary path)."""
    return f"{REDIS_PREFIX}:run:{run_id}"


def redis_progress_key(run_id: str) -> str:
    """Redis hash holding a run's latest per-batch progress record (JSON in field `latest`)."""
    return f"{REDIS_PREFIX}:run:{run_id}:progress"


def redis_replay_key(topic: str) -> str:
    """Redis hash holding the last replay's record for a topic (events produced, end offsets)."""
    return f"{REDIS_PREFIX}:replay:{topic}"


# Balance monitoring (keyshift.monitoring.results) and switch requests.
BALANCE_MONITOR_DAG_ID = "keyshift_balance_monitor"
SWITCH_DAG_ID = "keyshift_switch"


def redis_balance_latest_key(topic: str) -> str:
    """Redis string holding a monitored topic's latest balance record (JSON: evaluation, loads, decision)."""
    return f"{REDIS_PREFIX}:balance:{topic}:latest"


def redis_balance_series_key(topic: str) -> str:
    """Redis sorted set of a monitored topic's recent balance records (JSON members, score = epoch seconds)."""
    return f"{REDIS_PREFIX}:balance:{topic}:series"


def redis_balance_cursor_key(topic: str) -> str:
    """Redis hash of what the next evaluation of a topic starts from (end offsets, job counts, trigger state)."""
    return f"{REDIS_PREFIX}:balance:{topic}:cursor"


def redis_balance_switch_key(topic: str) -> str:
    """Redis hash holding the last switch decided for a topic (at_s, strategy_from, strategy_to, migration_s)."""
    return f"{REDIS_PREFIX}:balance:{topic}:last_switch"


def redis_switch_requests_key(topic: str) -> str:
    """Redis list of switch requests the `keyshift_switch` DAG accepted for a topic (JSON, newest first)."""
    return f"{REDIS_PREFIX}:switch:{topic}:requests"


def redis_switch_record_key(run_id: str) -> str:
    """Redis string holding a run's current (or last) switch record (JSON, `keyshift.migration.switch`)."""
    return f"{REDIS_PREFIX}:switch:run:{run_id}:record"


def redis_switch_lock_key(run_id: str) -> str:
    """Redis string held while a switch of the run is being requested and carried out (value: holder)."""
    return f"{REDIS_PREFIX}:switch:run:{run_id}:lock"


def redis_switch_history_key(run_id: str) -> str:
    """Redis list of a run's finished switch records (JSON, newest first)."""
    return f"{REDIS_PREFIX}:switch:run:{run_id}:history"


def redis_ysb_ad_campaign_key(topic: str) -> str:
    """Redis hash of the YSB generator that last wrote `topic`: ad_id -> campaign_id (the join table)."""
    return f"{REDIS_PREFIX}:ysb:{topic}:ad_campaign"


def redis_ysb_campaigns_key(topic: str) -> str:
    """Redis set of the campaign ids of the YSB generator that last wrote `topic`."""
    return f"{REDIS_PREFIX}:ysb:{topic}:campaigns"


def redis_ysb_ad_campaign_version_key(topic: str) -> str:
    """Redis counter the YSB generator increments each time it replaces `topic`'s ad -> campaign
    map, so the job's executors reload their cached copy only when it changed."""
    return f"{REDIS_PREFIX}:ysb:{topic}:ad_campaign:version"


def redis_ysb_run_campaigns_key(run_id: str) -> str:
    """Redis set of the campaigns a YSB job run wrote windows for."""
    return f"{REDIS_PREFIX}:ysb:run:{run_id}:campaigns"


def redis_ysb_campaign_key(run_id: str, campaign_id: str) -> str:
    """Redis hash of one campaign in a YSB job run: window_start_ms -> its window's key
    (`redis_ysb_window_key`), as the published benchmark keeps `campaign -> window timestamp ->
    window id`."""
    return f"{REDIS_PREFIX}:ysb:run:{run_id}:campaign:{campaign_id}"


def redis_ysb_campaign_windows_key(run_id: str, campaign_id: str) -> str:
    """Redis sorted set of one campaign's window starts in a YSB job run (score = start, ms)."""
    return f"{REDIS_PREFIX}:ysb:run:{run_id}:campaign:{campaign_id}:windows"


def redis_ysb_window_key(run_id: str, campaign_id: str, window_start_ms: int) -> str:
    """Redis hash of one (campaign, 10 s window) of a YSB job run: `seen_count` (views) and
    `time_updated` (wall-clock ms of the write)."""
    return f"{REDIS_PREFIX}:ysb:run:{run_id}:window:{campaign_id}:{int(window_start_ms)}"
