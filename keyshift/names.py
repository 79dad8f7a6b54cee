"""Names defined once: Kafka topics, Redis keys, Airflow DAG ids and the files of a run folder.

Every other module imports these rather than spelling a name again. The topic names and the Redis
prefix are read from `infra/stack.env` (`keyshift.stack_env`), the file docker-compose.yml gives
its containers, and only from there: no environment variable overrides them, so every process of
a deployment uses the same names.
"""

from dataclasses import dataclass
from pathlib import Path

from keyshift.checkpoint_files import is_uri
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

END_OF_INPUT_PREFIX = '{"control": "end_of_input"'
"""Values starting with this are end-of-input markers, not events: `{"control": "end_of_input",
"run_id": RUN, "event_time": MS}`. A bounded run writes them after draining its input so that the
watermark passes every open window; they move the watermark of their own run only and are then
dropped, never counted as events. Defined here, below every writer and reader of a topic (the
executors' operators among them, which so import no Kafka client), so a producer (the replays)
can tell them from another writer's records."""

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


def redis_batch_context_key(run_id: str, batch_id: int) -> str:
    """Redis string: what run batch `batch_id`'s tasks need from the driver (JSON; see
    `keyshift.eventtime.batch_channel`). Not under `redis_run_key`'s prefix, whose keys readers
    scan as run records."""
    return f"{REDIS_PREFIX}:batch:{run_id}:{int(batch_id)}:context"


def redis_batch_reports_key(run_id: str, batch_id: int, query: str) -> str:
    """Redis hash: task id -> what that ingest task of query `query` read in run batch `batch_id`."""
    return f"{REDIS_PREFIX}:batch:{run_id}:{int(batch_id)}:reports:{query}"


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


def redis_balance_cursor_key(topic: str, run_id: str | None = None) -> str:
    """Redis hash of what the next evaluation of a topic starts from (end offsets, job counts, trigger state):
    the topic's own (`run_id` None: an evaluation that reads no job run), or one job run's on it
    (`...:cursor:<run_id>`), so two runs reading one topic each measure what arrived since their own last evaluation."""
    return f"{REDIS_PREFIX}:balance:{topic}:cursor" + (f":{run_id}" if run_id else "")


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


@dataclass(frozen=True)
class RunDir:
    """The folder of one job run, `runs/<run_id>/`, and the name of every file keyshift keeps in it.

    Every module that reads or writes a run's files asks this class for the path, so a file's name
    is spelled once. Paths only: nothing is created or read here.

    Attributes:
        path: the run's folder (`Settings.runs_dir / run_id`).
    """

    path: Path

    JOB_RECORD = "job.json"
    SUMMARY = "summary.json"
    PROGRESS = "progress.jsonl"
    ATTEMPTS = "attempts.jsonl"
    DRIVER_LOG = "driver.log"
    TASK_SECONDS = "task_seconds.json"
    WINDOWS = "windows"
    KEY_WINDOWS = "key_windows"
    BUILTIN_WINDOWS = "builtin_windows"
    BUILTIN_CHECKPOINT = "builtin_checkpoint"
    LEDGER = "batches"
    PIECES = "pieces"
    PARTITION_CLOCKS = "partition-clocks"
    QUALITY = "quality.json"
    PIPELINE = "pipeline.json"
    DATA_DOCS = "data_docs"
    SUPERVISOR_SPEC = "run/supervisor.json"
    FIRST_CHECKPOINT = "checkpoint"

    @classmethod
    def of(cls, runs_dir: Path | str, run_id: str) -> "RunDir":
        """The folder of run `run_id` under `runs_dir` (`Settings.runs_dir`)."""
        return cls(Path(runs_dir) / run_id)

    @property
    def run_id(self) -> str:
        """The run's id: the folder's name."""
        return self.path.name

    @property
    def job_record(self) -> Path:
        """`job.json`: the run's config, start offsets, replay record and segments
        (`keyshift.processing.job_record`)."""
        return self.path / self.JOB_RECORD

    @property
    def summary(self) -> Path:
        """`summary.json`: the run's summary, written once when it ends (`keyshift.runs.RunRecorder`)."""
        return self.path / self.SUMMARY

    @property
    def progress(self) -> Path:
        """`progress.jsonl`: one JSON progress record per completed micro-batch."""
        return self.path / self.PROGRESS

    @property
    def attempts(self) -> Path:
        """`attempts.jsonl`: one line per attempt at the run (the first start, then each `--resume`):
        `attempt`, `started_at` (epoch seconds, once Spark is up) and `events_at_start` (the
        events the run had read when the attempt began, from its ledger)."""
        return self.path / self.ATTEMPTS

    @property
    def driver_log(self) -> Path:
        """`driver.log`: the driver's log (`keyshift.runlog`)."""
        return self.path / self.DRIVER_LOG

    @property
    def task_seconds(self) -> Path:
        """`task_seconds.json`: Spark task seconds per stateful partition (`keyshift.runtime.run_summary`)."""
        return self.path / self.TASK_SECONDS

    @property
    def windows(self) -> Path:
        """`windows/`: the tumbling windows table (Parquet, one file per micro-batch)."""
        return self.path / self.WINDOWS

    @property
    def key_windows(self) -> Path:
        """`key_windows/`: the key windows table of a `window="key_windows"` spec (Parquet)."""
        return self.path / self.KEY_WINDOWS

    @property
    def builtin_windows(self) -> Path:
        """`builtin_windows/`: the windows of Spark's built-in aggregation (the demo's comparison)."""
        return self.path / self.BUILTIN_WINDOWS

    @property
    def ledger(self) -> Path:
        """`batches/`: the sink's ledger, one JSON file per run batch id."""
        return self.path / self.LEDGER

    @property
    def pieces(self) -> Path:
        """`pieces/`: partial windows of split keys waiting for their other pieces."""
        return self.path / self.PIECES

    @property
    def partition_clocks(self) -> Path:
        """`partition-clocks/`: the clock of every Kafka partition per batch
        (`keyshift.eventtime.partition_clocks`)."""
        return self.path / self.PARTITION_CLOCKS

    @property
    def quality(self) -> Path:
        """`quality.json`: the Great Expectations validation of the run's outputs."""
        return self.path / self.QUALITY

    @property
    def pipeline(self) -> Path:
        """`pipeline.json`: what the Airflow pipeline DAG recorded about the run."""
        return self.path / self.PIPELINE

    @property
    def data_docs(self) -> Path:
        """`data_docs/`: Great Expectations' Data Docs site of the run's validations."""
        return self.path / self.DATA_DOCS

    @property
    def supervisor_spec(self) -> Path:
        """`run/supervisor.json`: the spec of the run's supervisor (`keyshift.orchestration.supervisor`)."""
        return self.path / self.SUPERVISOR_SPEC

    def checkpoint(self, name: str = FIRST_CHECKPOINT) -> Path | str:
        """A segment's Spark checkpoint location; `name` is the segment's `checkpoint` field:
        a folder name under the run (`checkpoint` for the first query, `checkpoint_name(i)` for
        the i-th), a Path returned, or a Hadoop URI (the run keeps its checkpoints elsewhere),
        returned as it is (`keyshift.checkpoint_files`)."""
        return name if is_uri(name) else self.path / name

    @staticmethod
    def checkpoint_name(index: int) -> str:
        """The checkpoint folder name of the run's segment `index` (>= 0): `checkpoint`, then
        `checkpoint-1`, `checkpoint-2`, ..."""
        return RunDir.FIRST_CHECKPOINT if index == 0 else f"{RunDir.FIRST_CHECKPOINT}-{index}"

    def handover(self, switch_id: str, batch_id: int) -> Path:
        """The state snapshot that switch `switch_id`'s barrier batch (run-wide id `batch_id`)
        handed over (`keyshift.processing.outputs.handover`):
        `switches/<switch_id>/handover-<batch_id>.parquet`."""
        return self.path / "switches" / switch_id / f"handover-{int(batch_id)}.parquet"

    @staticmethod
    def migrated_state_name(switch_id: str) -> str:
        """The migrated state file of switch `switch_id`, relative to the run folder (a segment's
        `initial_state` field): `switches/<switch_id>/initial_state.parquet`."""
        return f"switches/{switch_id}/initial_state.parquet"
