"""The restart policy of a detached continuous run: a supervisor that restarts a dead driver.

`launch.launch_job` does not start the driver itself: it starts this module as a small process,

    python -m keyshift.orchestration.supervisor --spec runs/<run_id>/run/supervisor.json

in its own session (`keyshift.stack.process`, name `supervisor`, log `logs/supervisor.log`), and
the supervisor runs the spark-submit driver as its child, in the child's own session too (name
`driver`, log `logs/driver.log`, appended across attempts). A driver that kills its own process
group (a failpoint, an operator's `kill -9 -<pgid>`) therefore never takes the supervisor along.

The policy is Flink's fixed-delay restart strategy (`restart-strategy.fixed-delay.attempts` and
`.delay`): when the driver ends abnormally (a non-zero exit code, or killed by a signal) and no
stop was requested, the supervisor waits `restart_delay_s` seconds and starts it again, at most
`max_restarts` times over the run's life (the count is never reset, as in Flink); the next death
after that fails the run. A restart continues the run from its checkpoint
(`--resume RUN_ID`: config from `runs/<run_id>/job.json`, counts from the batch ledger, Kafka side
outputs exactly once); a driver that died before its checkpoint existed starts afresh with its
original arguments (the driver refuses `--resume` without one). An exit code 0 is the job's own
end (a bounded run drained, or a continuous run stopped on SIGTERM) and is never restarted.

Stopping: SIGTERM or SIGINT to the supervisor (what `launch.stop_job` sends) means "stop the run":
the supervisor stops the driver gracefully (`stop_driver`: SIGTERM to the job's Python
driver, so it ends at a batch boundary and writes its summary; the group is killed only after a
timeout) and restarts nothing. A driver death is also never restarted once the run record has
`stop_requested_at`, so a stop sent to the driver directly is honoured too.

What the supervisor writes into the run record (`names.redis_run_key`, beside the launcher's and
the job's fields): `pid`/`pid_create_time` of each driver it starts (the job then overwrites `pid`
with its Python driver's), `attempt` (1 = the first run), and per restart `restarts` (+1),
`restart_history` (a JSON list of `{restart, at, exit_code, signal, signal_name, delay_s, from,
log_path, error}`, `error` being what the dead job recorded, if anything; the run's own `error` and
`finished_at` are cleared), `last_exit` and `state=restarting` until the new driver writes
`running`; when the policy gives up, `state=failed`, `error` (naming the driver log) and
`finished_at`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keyshift.errors import ConfigurationError
from keyshift.names import RunDir
from keyshift.runs import RunRecord

if TYPE_CHECKING:
    from keyshift.settings import Settings
    from keyshift.stack import process

log = logging.getLogger(__name__)

SUPERVISOR_NAME = "supervisor"
"""The supervisor's process name under `runs/<run_id>/` (pid file `run/supervisor.pid`, log
`logs/supervisor.log`)."""

DEFAULT_MAX_RESTARTS = 3
"""Restarts (attempts, in Flink's words) before a run whose driver keeps dying fails."""

DEFAULT_RESTART_DELAY_S = 10.0
"""Seconds between a driver's death and its restart. Flink's docs give the reason for a delay:
external systems get time to settle, here the dead driver's Kafka transaction to be fenced and
its Spark ports freed."""


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """Flink's fixed-delay restart strategy, for a detached driver.

    Attributes:
        max_restarts: restarts allowed over the run's life (Flink's
            `restart-strategy.fixed-delay.attempts`); 0 = never restart. 0 ≤ max_restarts ≤ 1000.
        restart_delay_s: seconds to wait after a death before the restart (Flink's
            `restart-strategy.fixed-delay.delay`). 0 ≤ restart_delay_s ≤ 3600.

    Raises:
        ConfigurationError: a value outside those ranges, naming it.
    """

    max_restarts: int = DEFAULT_MAX_RESTARTS
    restart_delay_s: float = DEFAULT_RESTART_DELAY_S

    def __post_init__(self) -> None:
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or not 0 <= self.max_restarts <= 1000:
            raise ConfigurationError(f"max_restarts must be an integer in [0, 1000]; got {self.max_restarts!r}")
        if not 0 <= float(self.restart_delay_s) <= 3600:
            raise ConfigurationError(f"restart_delay_s must be in [0, 3600] seconds; got {self.restart_delay_s!r}")


@dataclasses.dataclass(frozen=True)
class DriverExit:
    """How a driver process ended.

    Attributes:
        exit_code: its exit code, or None when a signal killed it or the status was lost.
        signal: the number of the signal that killed it, or None.
    """

    exit_code: int | None
    signal: int | None = None

    @classmethod
    def from_returncode(cls, returncode: int | None) -> DriverExit:
        """From a return code as `os.waitstatus_to_exitcode` gives it (negative: killed by that
        signal); None means the status is unknown (the process was reaped elsewhere)."""
        if returncode is None:
            return cls(None, None)
        if returncode < 0:
            return cls(None, -returncode)
        return cls(returncode, None)

    @property
    def clean(self) -> bool:
        """True for exit code 0: the job ended by itself (drained, or stopped on SIGTERM)."""
        return self.exit_code == 0

    @property
    def signal_name(self) -> str | None:
        """`SIGKILL` for signal 9, etc.; None when no signal killed the driver."""
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"

    def describe(self) -> str:
        """`signal 9 (SIGKILL)`, `exit code 1` or `unknown exit status`."""
        if self.signal is not None:
            return f"signal {self.signal} ({self.signal_name})"
        if self.exit_code is not None:
            return f"exit code {self.exit_code}"
        return "unknown exit status"


@dataclasses.dataclass(frozen=True)
class SupervisorSpec:
    """What one supervisor runs: written by `launch.launch_job` as JSON, read by `main`.

    Attributes:
        run_id: the keyshift run id.
        argv: the driver's first command (`spark-submit … app --run-id RUN_ID …`).
        resume_argv: the command of a restart (`spark-submit … app --resume RUN_ID`).
        policy: the restart policy.
        cwd: the drivers' working directory.
        stop_timeout_s: seconds a graceful stop waits at each step (`stop_driver`), unless
            the stop request in the run record says otherwise (`stop_timeout_s` field).
    """

    run_id: str
    argv: tuple[str, ...]
    resume_argv: tuple[str, ...]
    policy: RestartPolicy = RestartPolicy()
    cwd: str | None = None
    stop_timeout_s: float = 60.0

    def write(self, path: Path) -> Path:
        """Write the spec as JSON (atomically) to `path`; returns `path`."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def read(cls, path: Path) -> SupervisorSpec:
        """Load a spec written by `write`.

        Raises:
            ConfigurationError: the file is missing or malformed (launch the run again).
        """
        try:
            data = json.loads(Path(path).read_text())
            return cls(
                run_id=data["run_id"], argv=tuple(data["argv"]), resume_argv=tuple(data["resume_argv"]),
                policy=RestartPolicy(**data["policy"]), cwd=data.get("cwd"),
                stop_timeout_s=float(data.get("stop_timeout_s", 60.0)),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigurationError(f"supervisor spec {path} is unreadable ({exc}); launch the run again") from exc


def spec_path(run_home: Path) -> Path:
    """`runs/<run_id>/run/supervisor.json`: the spec of the run's supervisor."""
    return RunDir(run_home).supervisor_spec


def has_checkpoint(run_home: Path) -> bool:
    """Whether the run has a checkpoint to resume from: the driver's own rule for `--resume`
    (`keyshift.processing.job_record.has_checkpoint`)."""
    from keyshift.processing.job_record import has_checkpoint as resumable

    return resumable(run_home)


def restart_history(record: dict[str, str]) -> list[dict[str, Any]]:
    """A run record's `restart_history` as a list of entries (empty when absent or unreadable)."""
    try:
        history = json.loads(record.get("restart_history") or "[]")
    except json.JSONDecodeError:
        return []
    return history if isinstance(history, list) else []


def describe_restart(entry: dict[str, Any], number: int, record: dict[str, str] | None = None) -> str:
    """One restart in words: `driver died (signal 9), restart 1 of 3 in 10 s from its checkpoint`.

    Args:
        entry: the restart's `restart_history` entry (may be empty when it was not recorded).
        number: the restart's number (1 = the first). record: the run record, for `max_restarts`
            and `restart_delay_s` when the entry lacks them.
    """
    record = record or {}
    if entry.get("signal") is not None:
        died = f"signal {entry['signal']}"
    elif entry.get("exit_code") is not None:
        died = f"exit code {entry['exit_code']}"
    else:
        died = "unknown exit status"
    delay = entry.get("delay_s", record.get("restart_delay_s", "?"))
    try:
        delay_text = f"{float(delay):g}"
    except (TypeError, ValueError):
        delay_text = str(delay)
    source = "its checkpoint" if entry.get("from", "checkpoint") == "checkpoint" else "the start (no checkpoint yet)"
    return (f"driver died ({died}), restart {number} of {record.get('max_restarts', '?')} "
            f"in {delay_text} s from {source}")


def driver_record(settings: Settings, run_id: str) -> process.ProcessRecord | None:
    """The pid-file record of the run's driver when that very process still runs, else None."""
    from keyshift.orchestration import pipeline
    from keyshift.stack import process

    return process.running_record(pipeline.run_dir(settings, run_id), pipeline.DRIVER_NAME)


def stop_driver(settings: Settings, run_id: str, timeout_s: float = 60.0) -> bool:
    """Stop the run's driver gracefully: SIGTERM to the job's Python driver, then its group.

    The job stops at a batch boundary on SIGTERM and writes its summary (state `stopped`); the
    spark-submit JVM that leads the session then exits by itself. Signalling the whole group at
    once would take the JVM down under the Python driver mid-stop, so the Python driver (the
    record's `pid`, written by the job) is signalled first, and only if it is a member of the
    driver's session. Whatever still runs after `timeout_s` is stopped by
    `keyshift.stack.process.stop` (SIGTERM to the group, SIGKILL after another `timeout_s`).
    Used by the supervisor on a stop request, and by `stop_job` for a driver left unsupervised.
    It does not record a stop request: `stop_job` does.

    Args:
        settings: Redis and the runs folder. run_id: the run. timeout_s: seconds to wait at each step.

    Returns:
        True if a live driver was stopped, False if there was none.

    Raises:
        StackError: Redis unreachable.
    """
    from keyshift import names
    from keyshift.orchestration import pipeline
    from keyshift.runs import redis_client
    from keyshift.stack import process

    live = driver_record(settings, run_id)
    if live is None:
        log.info("Run %s has no live driver to stop", run_id)
        return False
    client = redis_client(settings)
    try:
        job_pid = int(client.hget(names.redis_run_key(run_id), "pid") or 0)
    finally:
        client.close()
    if job_pid and job_pid != live.pid and _in_session(job_pid, live.pid):
        log.info("Stopping run %s: SIGTERM to its Python driver %d", run_id, job_pid)
        os.kill(job_pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and driver_record(settings, run_id) is not None:
            time.sleep(0.5)
    if driver_record(settings, run_id) is not None:
        log.info("Stopping run %s: SIGTERM to the process group of %d", run_id, live.pid)
    process.stop(pipeline.run_dir(settings, run_id), pipeline.DRIVER_NAME, timeout_s=timeout_s)
    log.info("Driver of run %s stopped", run_id)
    return True


def _in_session(pid: int, session_id: int) -> bool:
    """Whether live process `pid` belongs to the session led by `session_id` (never signal strangers)."""
    try:
        return os.getsid(pid) == session_id
    except (ProcessLookupError, PermissionError):
        return False


def _utcnow_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Supervisor:
    """Runs one run's driver under a `RestartPolicy` (see the module docstring).

    Args:
        settings: the runs folder and Redis.
        spec: what to run and the policy.
    """

    POLL_S = 0.2
    """Seconds between checks of the driver's exit and of a stop request."""

    def __init__(self, settings, spec: SupervisorSpec) -> None:
        from keyshift import names
        from keyshift.orchestration import pipeline

        self.settings = settings
        self.spec = spec
        self.home = pipeline.run_dir(settings, spec.run_id)
        self.log_path = pipeline.driver_log_path(settings, spec.run_id)
        self.key = names.redis_run_key(spec.run_id)
        self.stop_requested = threading.Event()
        self._attempt = 0
        self._redis = None

    # ------------------------------------------------------------------ entry point

    def run(self) -> int:
        """Run the driver until it ends cleanly, a stop is requested, or the policy gives up.

        Returns:
            The supervisor's exit code: 0 when the run ended by itself or on request, 1 when the
            driver died more often than `max_restarts` allows (the run is then `failed`).
        """
        from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_fixed

        policy = self.spec.policy
        retrying = Retrying(
            stop=stop_after_attempt(policy.max_restarts + 1),  # the first run + max_restarts restarts
            wait=wait_fixed(policy.restart_delay_s),
            retry=retry_if_result(self._should_restart),
            before_sleep=self._record_restart,
            sleep=self._sleep,  # a stop ends the delay at once
            retry_error_callback=lambda state: state.outcome.result(),  # out of attempts: the last exit
        )
        ended = retrying(self._run_driver)
        return self._conclude(ended)

    def request_stop(self, signum: int | None = None, frame: Any = None) -> None:
        """Signal handler (SIGTERM, SIGINT): stop the driver gracefully and restart nothing."""
        log.info("Stop requested%s", f" (signal {signum})" if signum else "")
        self.stop_requested.set()

    # ------------------------------------------------------------------ one attempt

    def _run_driver(self) -> tuple[int, DriverExit | None]:
        """Start the driver (fresh or from its checkpoint) and wait for its end.

        Returns:
            (attempt number, how it ended), or (attempt, None) when a stop came first and no
            driver was started.
        """
        from keyshift.orchestration import pipeline
        from keyshift.stack import process

        self._attempt += 1
        attempt = self._attempt
        if self._stopping():
            return attempt, None
        resume = attempt > 1 and has_checkpoint(self.home)
        argv = self.spec.resume_argv if resume else self.spec.argv
        log.info("Attempt %d: starting the driver %s", attempt, "from its checkpoint" if resume else "afresh")
        started = process.start(self.home, pipeline.DRIVER_NAME, argv, cwd=Path(self.spec.cwd) if self.spec.cwd else None)
        self._update(pid=started.pid, pid_create_time=repr(started.create_time), attempt=attempt,
                     driver_started_at=_utcnow_iso())
        ended = self._wait(started.pid)
        log.info("Attempt %d: the driver (pid %d) ended with %s", attempt, started.pid, ended.describe())
        if not ended.clean:
            # whatever the dead leader left in its group (Python workers) goes with it, as a lost
            # machine's would; a restart must not meet a half-alive predecessor
            try:
                os.killpg(started.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return attempt, ended

    def _wait(self, pid: int) -> DriverExit:
        """Wait for child `pid` to end; on a stop request, stop it gracefully first."""
        stopping = False
        while True:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped by the stop's fallback: the status is lost
                return DriverExit(None, None)
            if done:
                return DriverExit.from_returncode(os.waitstatus_to_exitcode(status))
            if self.stop_requested.is_set() and not stopping:
                stopping = True
                stop_driver(self.settings, self.spec.run_id, self._stop_timeout_s())
                continue
            self.stop_requested.wait(self.POLL_S)

    # ------------------------------------------------------------------ the policy's hooks

    def _should_restart(self, result: tuple[int, DriverExit | None]) -> bool:
        """Restart after an abnormal end when no stop was requested (Flink restarts on any failure)."""
        _, ended = result
        return ended is not None and not ended.clean and not self._stopping()

    def _record_restart(self, retry_state) -> None:
        """tenacity's `before_sleep`: record restart n in the run record and the driver log."""
        attempt, ended = retry_state.outcome.result()
        restart, delay_s = attempt, retry_state.upcoming_sleep
        source = "checkpoint" if has_checkpoint(self.home) else "start"
        entry = {
            "restart": restart, "at": _utcnow_iso(), "exit_code": ended.exit_code, "signal": ended.signal,
            "signal_name": ended.signal_name, "delay_s": delay_s, "from": source, "log_path": str(self.log_path),
            "error": (self._get("error") or "")[:500] or None,  # what the dead job said, if it could
        }
        message = describe_restart(entry, restart, {"max_restarts": self.spec.policy.max_restarts})
        log.warning("Run %s: %s", self.spec.run_id, message)
        self._note(message)
        history = self._history() + [entry]
        self._update(state="restarting", last_exit=ended.describe(), restart_history=json.dumps(history))
        self._delete("error", "finished_at")  # the dead attempt's end is in its history entry, not the run's
        self._incr("restarts")

    def _sleep(self, seconds: float) -> None:
        self.stop_requested.wait(seconds)

    def _conclude(self, result: tuple[int, DriverExit | None]) -> int:
        """Record how the run ended, as far as the job did not: returns the exit code."""
        attempt, ended = result
        if ended is not None and ended.clean:
            log.info("Run %s: the driver ended by itself; supervisor done", self.spec.run_id)
            return 0
        if ended is None or self._stopping():
            state = self._get("state")
            if state in ("starting", "running", "restarting"):  # the job wrote no final state
                self._update(state="stopped", finished_at=_utcnow_iso())
            log.info("Run %s: stopped on request; supervisor done", self.spec.run_id)
            return 0
        policy = self.spec.policy
        error = (f"driver died ({ended.describe()}) on attempt {attempt} of {policy.max_restarts + 1}: the restart "
                 f"limit max_restarts={policy.max_restarts} is reached; see the driver log {self.log_path}")
        log.error("Run %s: %s", self.spec.run_id, error)
        self._note(f"{error}; the run fails")
        self._update(state="failed", error=error, last_exit=ended.describe(), finished_at=_utcnow_iso())
        return 1

    def record_own_failure(self, exc: BaseException) -> None:
        """Mark the run failed because the supervisor itself failed (its log has the traceback)."""
        from keyshift.orchestration.pipeline import run_dir
        from keyshift.stack.process import log_file

        supervisor_log = log_file(run_dir(self.settings, self.spec.run_id), SUPERVISOR_NAME)
        self._update(state="failed", finished_at=_utcnow_iso(),
                     error=f"the supervisor failed: {type(exc).__name__}: {exc}; see {supervisor_log} and {self.log_path}")

    # ------------------------------------------------------------------ record and log

    def _stopping(self) -> bool:
        """A stop was requested: by signal, or as `stop_requested_at` in the run record."""
        if self.stop_requested.is_set():
            return True
        if self._get("stop_requested_at"):
            self.stop_requested.set()
            return True
        return False

    def _stop_timeout_s(self) -> float:
        try:
            return float(self._get("stop_timeout_s") or self.spec.stop_timeout_s)
        except ValueError:
            return self.spec.stop_timeout_s

    def _note(self, text: str) -> None:
        """Append a line to the driver log, between one attempt's output and the next."""
        with self.log_path.open("a") as out:
            out.write(f"\n==== keyshift supervisor at {_utcnow_iso()}: {text}\n")

    def _client(self):
        if self._redis is None:
            from keyshift.runs import redis_client

            self._redis = redis_client(self.settings)
        return self._redis

    def _history(self) -> list[dict[str, Any]]:
        try:
            return json.loads(self._get("restart_history") or "[]")
        except json.JSONDecodeError:
            return []

    def _get(self, field: str) -> str | None:
        import redis

        try:
            return self._client().hget(self.key, field)
        except (redis.RedisError, OSError) as exc:  # the driver's fate must not hang on Redis
            log.warning("Cannot read %s of %s from Redis: %s", field, self.key, exc)
            self._redis = None
            return None

    def _update(self, **fields: Any) -> None:
        import redis

        try:
            self._client().hset(self.key, mapping=RunRecord.encode(**fields))
        except (redis.RedisError, OSError) as exc:
            log.warning("Cannot record %s in %s: %s", sorted(fields), self.key, exc)
            self._redis = None

    def _delete(self, *fields: str) -> None:
        import redis

        try:
            self._client().hdel(self.key, *fields)
        except (redis.RedisError, OSError) as exc:
            log.warning("Cannot clear %s in %s: %s", fields, self.key, exc)
            self._redis = None

    def _incr(self, field: str) -> None:
        import redis

        try:
            self._client().hincrby(self.key, field, 1)
        except (redis.RedisError, OSError) as exc:
            log.warning("Cannot count %s in %s: %s", field, self.key, exc)
            self._redis = None


def main(argv: list[str] | None = None) -> int:
    """`python -m keyshift.orchestration.supervisor --spec PATH`: supervise one run's driver.

    Settings (runs folder, Redis) come from the `KEYSHIFT_*` environment that `launch_job` sets.

    Returns:
        The process's exit code (see `Supervisor.run`); 2 for a bad command line or spec.
    """
    import argparse

    from keyshift.settings import Settings

    parser = argparse.ArgumentParser(prog="python -m keyshift.orchestration.supervisor",
                                     description="Run a keyshift driver under its restart policy.")
    parser.add_argument("--spec", required=True, type=Path, help="the supervisor spec (runs/<run_id>/run/supervisor.json)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        spec = SupervisorSpec.read(args.spec)
    except ConfigurationError as exc:
        log.error("%s", exc)
        return 2
    supervisor = Supervisor(Settings(), spec)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, supervisor.request_stop)
    log.info("Supervising run %s: max_restarts %d, restart_delay_s %g (pid %d)", spec.run_id,
             spec.policy.max_restarts, spec.policy.restart_delay_s, os.getpid())
    try:
        return supervisor.run()
    except Exception as exc:  # the supervisor itself broke: say so in the record, not only here
        log.exception("Supervisor of run %s failed", spec.run_id)
        supervisor.record_own_failure(exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
