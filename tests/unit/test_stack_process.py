"""Pid-file supervision: start detached, recognise only our own process, stop its whole group."""

from __future__ import annotations

import json
import os
import sys
import time

import psutil
import pytest

from keyshift.errors import StackError
from keyshift.stack import process

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def home(tmp_path):
    yield tmp_path
    # never leave a test's process behind, whatever the test did
    for pid_path in (tmp_path / "run").glob("*.pid"):
        process.stop(tmp_path, pid_path.stem, timeout_s=5)


def test_start_writes_pid_file_and_log(home):
    record = process.start(home, "sleeper", SLEEPER)

    assert process.is_running(home, "sleeper")
    on_disk = json.loads(process.pid_file(home, "sleeper").read_text())
    assert on_disk["pid"] == record.pid
    assert on_disk["argv"] == SLEEPER
    assert process.read_record(home, "sleeper") == record
    assert "keyshift starting sleeper" in process.log_file(home, "sleeper").read_text()
    # its own session: the group it leads is what stop() signals
    assert os.getpgid(record.pid) == record.pid


def test_start_refuses_a_second_copy(home):
    process.start(home, "sleeper", SLEEPER)
    with pytest.raises(StackError, match="already running"):
        process.start(home, "sleeper", SLEEPER)


def test_stop_ends_the_process_and_removes_the_pid_file(home):
    record = process.start(home, "sleeper", SLEEPER)

    assert process.stop(home, "sleeper", timeout_s=10) is True

    assert not psutil.pid_exists(record.pid) or psutil.Process(record.pid).status() == psutil.STATUS_ZOMBIE
    assert not process.pid_file(home, "sleeper").exists()
    assert process.stop(home, "sleeper") is False  # nothing left to stop


def test_stop_ends_the_children_too(home):
    # a shell that forks a grandchild, like Airflow's scheduler forking executor workers
    record = process.start(home, "forker", ["/bin/sh", "-c", "sleep 120 & wait"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not psutil.Process(record.pid).children():
        time.sleep(0.05)
    child = psutil.Process(record.pid).children()[0]

    process.stop(home, "forker", timeout_s=10)

    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


def test_stop_after_sigterm_is_ignored_uses_sigkill(home):
    stubborn = [sys.executable, "-c",
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"]
    record = process.start(home, "stubborn", stubborn)
    time.sleep(0.3)  # let it install its handler

    assert process.stop(home, "stubborn", timeout_s=0.5) is True
    assert not psutil.pid_exists(record.pid) or psutil.Process(record.pid).status() == psutil.STATUS_ZOMBIE


def test_a_recycled_pid_is_not_ours_and_is_never_signalled(home):
    # a pid file naming this very test process, but with another creation time: a recycled pid
    me = psutil.Process()
    stale = process.ProcessRecord(
        name="ghost", pid=me.pid, create_time=me.create_time() - 1000.0,
        argv=("ghost",), log_file=str(home / "ghost.log"), started_at="2000-01-01T00:00:00+00:00",
    )
    process._write_record(home, stale)

    assert not process.is_running(home, "ghost")
    assert process.stop(home, "ghost") is False  # we are still alive to assert this
    assert not process.pid_file(home, "ghost").exists()


def test_an_exited_process_is_not_running(home):
    process.start(home, "quick", [sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while process.is_running(home, "quick") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process.is_running(home, "quick")


@pytest.mark.parametrize("content", ["", "not json", '{"pid": 1}', '{"name": "x", "pid": "abc"}'])
def test_an_unreadable_pid_file_counts_as_absent(home, content):
    path = process.pid_file(home, "broken")
    path.parent.mkdir(parents=True)
    path.write_text(content)

    assert process.read_record(home, "broken") is None
    assert not process.is_running(home, "broken")


def test_start_of_a_missing_program_is_a_stack_error(home):
    with pytest.raises(StackError, match="cannot start"):
        process.start(home, "nothing", [str(home / "no-such-program")])


def test_wait_until_returns_the_seconds_waited():
    calls = iter([False, False, True])
    waited = process.wait_until(lambda: next(calls), timeout_s=5, what="thing", interval_s=0.01)
    assert 0 <= waited < 5


def test_wait_until_treats_connection_errors_as_not_ready():
    calls = iter([ConnectionRefusedError(), True])

    def check():
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value

    process.wait_until(check, timeout_s=5, what="thing", interval_s=0.01)


def test_wait_until_timeout_names_the_log_and_quotes_it(tmp_path):
    log_path = tmp_path / "svc.log"
    log_path.write_text("booting\nERROR: address already in use\n")

    with pytest.raises(StackError) as caught:
        process.wait_until(lambda: False, timeout_s=0.2, what="svc", log_path=log_path, interval_s=0.05)

    message = str(caught.value)
    assert "svc was not healthy within" in message
    assert str(log_path) in message
    assert "address already in use" in message


def test_wait_until_stops_at_once_when_the_process_is_gone(tmp_path):
    started = time.monotonic()
    with pytest.raises(StackError, match="exited before it became healthy"):
        process.wait_until(lambda: False, timeout_s=60, what="svc",
                           log_path=tmp_path / "svc.log", alive=lambda: False)
    assert time.monotonic() - started < 5


def test_tail_returns_the_last_lines(tmp_path):
    path = tmp_path / "x.log"
    path.write_text("".join(f"line {i}\n" for i in range(100)))
    assert process.tail(path, 2) == "line 98\nline 99"
    assert process.tail(tmp_path / "missing.log") == ""


def test_port_open_on_a_closed_port_is_false():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refuses connections
        assert process.port_open("127.0.0.1", port, timeout_s=0.2) is False


LISTENER = [sys.executable, "-c",
            "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1])));"
            " s.listen(); time.sleep(120)"]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listen(home, name, port):
    record = process.start(home, name, [*LISTENER, str(port)])
    deadline = time.monotonic() + 10
    while not process.port_open("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.05)
    return record


def test_port_owner_names_the_state_dir_that_started_the_listener(home):
    port = _free_port()
    record = _listen(home, "listener", port)

    owner = process.port_owner(port)

    assert owner == process.PortOwner(record.pid, home)
    assert str(home) in owner.describe()
    assert process.port_owner(_free_port()) is None


def test_airflow_of_another_state_dir_is_not_reused(home, tmp_path):
    from keyshift.settings import Settings
    from keyshift.stack import airflow

    port = _free_port()
    _listen(home, "airflow-lookalike", port)  # "another checkout's" stack listens on the port
    mine = Settings(home=tmp_path / "mine", airflow_port=port)

    with pytest.raises(StackError, match=f"belongs to another keyshift stack .*{home}"):
        airflow.start(mine)
    assert not process.is_running(mine.home, "airflow-api-server")


def test_a_large_log_is_rotated_on_start(home, monkeypatch):
    monkeypatch.setattr(process, "LOG_ROTATE_BYTES", 10)
    log_path = process.log_file(home, "quick")
    log_path.parent.mkdir(parents=True)
    log_path.write_text("an old run's long log\n")

    process.start(home, "quick", [sys.executable, "-c", "pass"])

    assert log_path.with_suffix(".log.1").read_text() == "an old run's long log\n"
    assert "an old run" not in log_path.read_text()


def test_write_private_leaves_a_file_only_its_owner_reads(tmp_path):
    path = process.write_private(tmp_path / "sub" / "secret.conf", "requirepass x\n")
    process.write_private(path, "requirepass y\n")  # an existing file too

    assert path.read_text() == "requirepass y\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["secret.conf"]  # no temporary file left


def test_a_running_service_with_another_config_is_not_reused(tmp_path):
    path = tmp_path / "redis.conf"
    process.check_config_unchanged(tmp_path, "redis", path, "port 1\n")  # no file: nothing to compare
    path.write_text("port 1\n")
    process.check_config_unchanged(tmp_path, "redis", path, "port 1\n")  # the same: reused

    with pytest.raises(StackError, match=r"restart it.*`keyshift stack down --only redis`"):
        process.check_config_unchanged(tmp_path, "redis", path, "port 1\nrequirepass x\n")
