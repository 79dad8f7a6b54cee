"""Background processes supervised through pid files: start detached, check, stop only our own.

Each process keyshift starts gets a name (`kafka`, `redis`, `airflow-scheduler`, ...), a log file
`<home>/logs/<name>.log` (stdout and stderr, appended) and a pid file `<home>/run/<name>.pid`.
The pid file is JSON: the pid, the process's creation time as the kernel reports it, the command
line and the log path. A pid file only counts when a live process has that pid *and* that creation
time, so a recycled pid never makes keyshift report, or stop, somebody else's process.

Every process starts in its own session (so its process group id equals its pid); `stop` signals
that whole group, which also ends the helpers a service forks (Airflow's executor workers, for one).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil
from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

from keyshift.errors import StackError

log = logging.getLogger("keyshift.stack.process")

HOME_MARKER = "KEYSHIFT_STACK_HOME"
"""Environment variable set in every process keyshift starts: the state directory that started it."""

LOG_ROTATE_BYTES = 50 * 1024 * 1024
"""A log larger than this (50 MiB) is moved to `<name>.log.1` when its process starts again."""

_CREATE_TIME_TOLERANCE_S = 0.05
"""psutil reports creation times rounded to clock ticks; two reads of one process agree within this."""


@dataclass(frozen=True)
class ProcessRecord:
    """What a pid file says about one process keyshift started.

    Attributes:
        name: the process's name within the stack (`kafka`, `airflow-api-server`, ...).
        pid: its process id, also its process group id (it leads its own session).
        create_time: its creation time, seconds since the epoch as psutil reports it.
        argv: the command line it was started with.
        log_file: where its stdout and stderr go.
        started_at: when keyshift started it, ISO 8601 UTC.
    """

    name: str
    pid: int
    create_time: float
    argv: tuple[str, ...]
    log_file: str
    started_at: str


def run_dir(home: Path) -> Path:
    """Folder of the pid files under the state directory `home`."""
    return home / "run"


def log_dir(home: Path) -> Path:
    """Folder of the service logs under the state directory `home`."""
    return home / "logs"


def pid_file(home: Path, name: str) -> Path:
    """Pid file of process `name`: `<home>/run/<name>.pid`."""
    return run_dir(home) / f"{name}.pid"


def log_file(home: Path, name: str) -> Path:
    """Log file of process `name`: `<home>/logs/<name>.log`."""
    return log_dir(home) / f"{name}.log"


def read_record(home: Path, name: str) -> ProcessRecord | None:
    """The pid file of `name`, or None when there is none or it cannot be parsed.

    A pid file that exists but is not valid JSON is logged and treated as absent.
    """
    path = pid_file(home, name)
    try:
        data = json.loads(path.read_text())
        return ProcessRecord(
            name=data["name"],
            pid=int(data["pid"]),
            create_time=float(data["create_time"]),
            argv=tuple(data["argv"]),
            log_file=data["log_file"],
            started_at=data["started_at"],
        )
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable pid file %s: %s", path, exc)
        return None


def _write_record(home: Path, record: ProcessRecord) -> None:
    path = pid_file(home, record.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".pid.tmp")
    tmp.write_text(json.dumps(asdict(record), indent=2) + "\n")
    tmp.replace(path)


def _live_process(record: ProcessRecord) -> psutil.Process | None:
    """The process the record names, if it is alive and is the very process we started."""
    try:
        proc = psutil.Process(record.pid)
        if abs(proc.create_time() - record.create_time) > _CREATE_TIME_TOLERANCE_S:
            return None  # the pid was recycled: not ours
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def is_running(home: Path, name: str) -> bool:
    """True when `name` has a pid file whose process is alive and is the one keyshift started."""
    record = read_record(home, name)
    return record is not None and _live_process(record) is not None


def running_record(home: Path, name: str) -> ProcessRecord | None:
    """The pid-file record of `name` when its process is running, else None."""
    record = read_record(home, name)
    if record is None or _live_process(record) is None:
        return None
    return record


def start(
    home: Path,
    name: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ProcessRecord:
    """Start `argv` detached from this process, logging to `<home>/logs/<name>.log`.

    The process gets its own session (it outlives the `keyshift` command that started it), no
    standard input, and stdout and stderr appended to its log file (a log over 50 MiB is first
    moved to `<name>.log.1`). Its pid file is written before this returns.

    Args:
        home: the state directory.
        name: the process's name within the stack; names its pid and log files.
        argv: the command and its arguments; `argv[0]` must be an executable path or on PATH.
        env: the complete environment of the new process (None: this one's). keyshift adds
            `KEYSHIFT_STACK_HOME=<home>`, which tells `port_owner` whose process it is.
        cwd: its working directory (None: this one's).

    Returns:
        The record written to the pid file.

    Raises:
        StackError: when `name` is already running (stop it first), or the command cannot start.
    """
    existing = running_record(home, name)
    if existing is not None:
        raise StackError(f"{name} is already running (pid {existing.pid}); stop it first")
    env = dict(os.environ if env is None else env)
    env[HOME_MARKER] = str(home)
    log_path = log_file(home, name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if log_path.exists() and log_path.stat().st_size > LOG_ROTATE_BYTES:
        log_path.replace(log_path.with_suffix(".log.1"))  # keep one previous log
    with log_path.open("ab") as out:
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        out.write(f"\n==== keyshift starting {name} at {stamp}: {' '.join(argv)}\n".encode())
        out.flush()
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise StackError(f"cannot start {name} ({argv[0]}): {exc}") from exc
    try:
        create_time = psutil.Process(proc.pid).create_time()
    except psutil.NoSuchProcess:
        create_time = 0.0  # it died at once; is_running will say so and the log tells why
    record = ProcessRecord(
        name=name,
        pid=proc.pid,
        create_time=create_time,
        argv=tuple(argv),
        log_file=str(log_path),
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    _write_record(home, record)
    log.info("started %s (pid %d), log %s", name, proc.pid, log_path)
    return record


def _group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return members


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    """Collect the exit status of a child of this process, so it leaves no zombie behind."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop(home: Path, name: str, *, timeout_s: float = 30.0) -> bool:
    """Stop process `name` and its process group, if keyshift started it and it still runs.

    Sends SIGTERM to the group, waits up to `timeout_s` seconds for every member to exit, then
    sends SIGKILL to what is left. The pid file is removed in every case where it no longer names
    a live process of ours (a stale pid file is just deleted; nothing is signalled).

    Args:
        home: the state directory.
        name: the process's name within the stack.
        timeout_s: seconds to wait after SIGTERM before SIGKILL.

    Returns:
        True when a running process was stopped, False when there was nothing of ours to stop.
    """
    record = read_record(home, name)
    if record is None:
        return False
    proc = _live_process(record)
    if proc is None:
        log.info("%s is not running; removing stale pid file", name)
        pid_file(home, name).unlink(missing_ok=True)
        return False
    pgid = record.pid  # started with start_new_session: it leads its own group
    log.info("stopping %s (pid %d)", name, record.pid)
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap(record.pid)
        if not _group_members(pgid):
            break
        time.sleep(0.2)
    else:
        log.warning("%s did not exit within %.0f s of SIGTERM; sending SIGKILL", name, timeout_s)
        _signal_group(pgid, signal.SIGKILL)
        time.sleep(0.2)
        _reap(record.pid)
    pid_file(home, name).unlink(missing_ok=True)
    log.info("stopped %s", name)
    return True


def write_private(path: Path, text: str) -> Path:
    """Write `text` to `path` readable by its owner only (mode 0600), atomically; return `path`.

    For files that hold a password or a secret (a rendered config, a generated password). The
    file is written beside `path` with mode 0600 from its creation on, then renamed over it, so
    no reader ever sees it half written or with wider permissions.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o600)  # O_CREAT's mode is masked by the umask; make it exact
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def check_config_unchanged(home: Path, name: str, path: Path, wanted: str) -> None:
    """Refuse to reuse a running service whose rendered config differs from what the settings give.

    A service keyshift started runs with the config file rendered at its start; when the settings
    now render another one (a password or SASL switched on or off, another port), reusing the
    process would leave clients and server disagreeing (and a health wait running into its
    timeout). Does nothing when there is no rendered file.

    Raises:
        StackError: naming the file and the restart that applies the settings.
    """
    try:
        running = path.read_text()
    except FileNotFoundError:
        return
    if running != wanted:
        raise StackError(
            f"{name} runs with another configuration than the settings give now ({path}: a password, "
            f"SASL or a port changed); restart it to apply them: `keyshift stack down --only {name}`, "
            f"then `keyshift stack up --only {name}`"
        )


def tail(path: Path | str, lines: int = 20) -> str:
    """The last `lines` lines of a text file ('' when it does not exist), for error messages."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class PortOwner:
    """The process listening on a port, and the keyshift state directory that started it.

    Attributes:
        pid: the listening process.
        keyshift_home: the state directory of the keyshift stack that started it (from its
            `KEYSHIFT_STACK_HOME`), or None when keyshift did not start it or it cannot be told.
    """

    pid: int
    keyshift_home: Path | None

    def describe(self) -> str:
        """`started by keyshift in <home>` or `not started by keyshift`, with the pid."""
        if self.keyshift_home is None:
            return f"pid {self.pid}, not started by keyshift"
        return f"pid {self.pid}, started by keyshift in {self.keyshift_home}"


def port_owner(port: int) -> PortOwner | None:
    """Who listens on TCP `port` on this machine, or None when nobody does or it cannot be seen.

    Seeing other users' processes needs root; for them the answer is None.
    """
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, PermissionError):
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                marker = psutil.Process(conn.pid).environ().get(HOME_MARKER)
            except (psutil.AccessDenied, psutil.NoSuchProcess):
                marker = None
            return PortOwner(conn.pid, Path(marker) if marker else None)
    return None


def refuse_taken_port(port: int, setting: str, host: str = "127.0.0.1") -> None:
    """Refuse to start a service whose port something else holds.

    Args:
        port: the service's port. setting: the `KEYSHIFT_*` variable that moves it, named in the
            message. host: the address it binds.

    Raises:
        StackError: the port accepts connections; the message names its owner when known.
    """
    if port_open(host, port):
        owner = port_owner(port)
        raise StackError(f"port {host}:{port} is in use ({owner.describe() if owner else 'owner unknown'}); "
                         f"stop it, or choose another port with {setting}")


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """True when something accepts TCP connections on `host:port`."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_until(
    check: Callable[[], bool],
    *,
    timeout_s: float,
    what: str,
    log_path: Path | str | None = None,
    alive: Callable[[], bool] | None = None,
    interval_s: float = 1.0,
) -> float:
    """Call `check` every `interval_s` seconds until it returns True; return the seconds waited.

    Args:
        check: the health probe; it returns False (or raises an OSError/ConnectionError) while the
            service is not ready.
        timeout_s: seconds to wait before giving up.
        what: what is awaited, for messages ("kafka on 127.0.0.1:9092").
        log_path: the service's log file, named (with its last lines) in errors.
        alive: optional check that the service's process still runs; when it returns False the
            wait stops at once instead of running into the timeout.
        interval_s: seconds between probes.

    Raises:
        StackError: on timeout, or when `alive` reports the process gone; the message names the
            log file and quotes its last lines.
    """
    started = time.monotonic()

    def probe() -> bool:
        if alive is not None and not alive():
            raise StackError(_failure(f"{what} exited before it became healthy", log_path))
        try:
            return bool(check())
        except (OSError, ConnectionError) as exc:
            log.debug("%s not ready yet: %s", what, exc)
            return False

    retrying = Retrying(
        stop=stop_after_delay(timeout_s),
        wait=wait_fixed(interval_s),
        retry=retry_if_result(lambda ready: not ready),
    )
    try:
        retrying(probe)
    except RetryError:
        raise StackError(
            _failure(f"{what} was not healthy within {timeout_s:.0f} s", log_path)
        ) from None
    return time.monotonic() - started


def _failure(message: str, log_path: Path | str | None) -> str:
    if log_path is None:
        return message
    last = tail(log_path, 15)
    quoted = ("\n  last lines:\n    " + "\n    ".join(last.splitlines())) if last else ""
    return f"{message}; see its log {log_path}{quoted}"
