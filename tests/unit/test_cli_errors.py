"""Every `keyshift` command group fails with one clear line, not a traceback.

The real console script (`.venv/bin/keyshift`) runs in a subprocess against a stack that is not
there: Kafka, Redis and Airflow on closed ports, an empty state directory, runs and cache. Each
case must exit with status 1 (2 for wrong arguments), print exactly one line on stderr, starting
with `error:` and naming the fix, print no traceback, and fail within seconds (no client waiting
out its default connection timeout). The shared stack is never touched.

A few cases need "Kafka up, Redis down": a plain TCP listener stands in for the broker there,
since the command checks that something listens before it checks Redis.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

KEYSHIFT = Path(sys.executable).parent / "keyshift"
SECONDS = 30.0
"""Upper bound per command: a start of the CLI takes 2-5 s on a busy 2-core machine; kafka-python's
default bootstrap wait alone is 30 s, so a command that waits it out fails this bound."""


@dataclass(frozen=True)
class Case:
    """One command line, the failure it meets, and what its error line must say."""

    id: str
    argv: tuple[str, ...]
    says: tuple[str, ...]  # fragments the error line must contain, in this order
    exit_code: int = 1
    kafka_listens: bool = False  # a bare TCP listener on the Kafka port (Redis stays closed)
    env: tuple[tuple[str, str], ...] = ()


STACK_UP = "`keyshift stack up`"
CASES = [
    # stack: a wrong service name
    Case("stack-up-unknown-service", ("stack", "up", "--only", "zookeeper"), ("unknown service(s) zookeeper", "choose from")),
    # data: never fetched
    Case("data-path-not-fetched", ("data", "path", "flights"), ("flights data not usable", "`keyshift data fetch flights`")),
    # topics: Kafka down
    Case("topics-create-kafka-down", ("topics", "create", "t1"), ("no Kafka broker answers", STACK_UP)),
    Case("topics-describe-kafka-down", ("topics", "describe"), ("no Kafka broker answers", STACK_UP)),
    # topics: a learned strategy needs Redis too, checked before any topic is created
    Case("topics-create-learned-redis-down", ("topics", "create", "t1", "--strategy", "least_count"),
         ("Redis at", "not reachable", STACK_UP), kafka_listens=True),
    # replay: Kafka down, then Redis down
    Case("replay-kafka-down", ("replay", "flights", "--limit", "10"), ("no Kafka broker answers", STACK_UP)),
    Case("replay-redis-down", ("replay", "flights", "--limit", "10"), ("Redis at", "not reachable", STACK_UP), kafka_listens=True),
    Case("replay-ysb-kafka-down", ("replay", "ysb", "--rate", "10", "--duration", "1"), ("no Kafka broker answers", STACK_UP)),
    Case("replay-ysb-redis-down", ("replay", "ysb", "--rate", "10", "--duration", "1"), ("Redis at", "not reachable", STACK_UP),
         kafka_listens=True),
    # replay ysb: a Zipf exponent of 0 is refused by its option before any service is asked
    Case("replay-ysb-zipf-zero", ("replay", "ysb", "--rate", "10", "--duration", "1", "--zipf", "0"), ("--zipf",), exit_code=2),
    # job: the services down; a run id that has no checkpoint
    Case("job-run-stack-down", ("job", "run", "flight_delays", "--limit", "10"), (STACK_UP,)),
    Case("job-resume-bad-run-id", ("job", "run", "flight_delays", "--resume", "no-such-run"), ("no-such-run",)),
    # run: the demo checks the stack before it creates anything
    Case("run-demo-kafka-down", ("run", "demo", "--limit", "10"), ("no Kafka broker answers", STACK_UP)),
    Case("run-demo-redis-down", ("run", "demo", "--limit", "10"), ("Redis at", STACK_UP), kafka_listens=True),
    # bench: a broker asked for and absent fails before minutes of benchmarks
    Case("bench-broker-down", ("bench", "placement", "--out", "bench.json", "--broker"), ("no Kafka broker answers", STACK_UP)),
    # balance: Kafka down; Redis down and no Parquet history
    Case("balance-evaluate-topic-kafka-down", ("balance", "evaluate", "--topic", "flights"), ("no Kafka broker answers", STACK_UP)),
    Case("balance-show-redis-down", ("balance", "show", "--topic", "flights"), ("Redis at", STACK_UP, "Parquet history")),
    Case("balance-show-nothing-stored", ("balance", "show"), ("no balance results", "`keyshift balance evaluate`")),
    # dq: a run id that has no outputs
    Case("dq-run-bad-run-id", ("dq", "run", "--run", "no-such-run"), ("no-such-run",)),
    # wrong arguments: the problem and the command's help
    Case("usage-bad-option-value", ("topics", "create", "--partitions", "0"),
         ("'--partitions'", "`keyshift topics create --help`"), exit_code=2),
    Case("usage-unknown-command", ("nosuch",), ("No such command 'nosuch'", "`keyshift --help`"), exit_code=2),
    # a bad setting: the variable and the fix
    Case("setting-not-an-integer", ("topics", "describe"), ("KEYSHIFT_KAFKA_PORT='not-a-port'", "fix or unset"),
         env=(("KEYSHIFT_KAFKA_PORT", "not-a-port"),)),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str
    seconds: float


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    """Run every case (four at a time) against closed ports in an empty state; their outcomes by id."""
    ports = {name: _free_port() for name in ("kafka", "kafka_controller", "redis", "airflow")}
    listener = socket.socket()
    listener.bind(("127.0.0.1", _free_port()))
    listener.listen(64)  # accepts TCP and never answers: "something listens" on the Kafka port
    base = {key: value for key, value in os.environ.items() if not key.startswith(("KEYSHIFT_", "SPARK_"))}
    root = tmp_path_factory.mktemp("cli")  # pytest's factory is not thread-safe: one folder, made here

    def run(case: Case) -> tuple[str, Outcome]:
        work = root / case.id
        work.mkdir()
        env = {
            **base,
            "KEYSHIFT_HOME": str(work / "state"),
            "KEYSHIFT_RUNS_DIR": str(work / "runs"),
            "KEYSHIFT_CACHE_DIR": str(work / "cache"),
            "KEYSHIFT_KAFKA_PORT": str(listener.getsockname()[1] if case.kafka_listens else ports["kafka"]),
            "KEYSHIFT_KAFKA_CONTROLLER_PORT": str(ports["kafka_controller"]),
            "KEYSHIFT_REDIS_PORT": str(ports["redis"]),
            "KEYSHIFT_AIRFLOW_PORT": str(ports["airflow"]),
            **dict(case.env),
        }
        started = time.monotonic()
        result = subprocess.run(
            [str(KEYSHIFT), *case.argv], env=env, cwd=work, capture_output=True, text=True, timeout=120, check=False
        )
        return case.id, Outcome(result.returncode, result.stdout, result.stderr, time.monotonic() - started)

    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            return dict(pool.map(run, CASES))
    finally:
        listener.close()


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_one_clear_error_line(outcomes, case):
    outcome = outcomes[case.id]
    lines = outcome.stderr.strip().splitlines()

    assert "Traceback" not in outcome.stderr, outcome.stderr
    assert outcome.code == case.exit_code, outcome.stderr
    assert len(lines) == 1, outcome.stderr  # no log lines before it, no usage block
    assert lines[0].startswith("error: "), lines[0]
    position = 0
    for fragment in case.says:
        found = lines[0].find(fragment, position)
        assert found >= 0, f"{fragment!r} missing from (or out of order in) {lines[0]!r}"
        position = found + len(fragment)
    assert outcome.seconds < SECONDS, f"took {outcome.seconds:.1f} s"


def test_stack_status_reports_closed_ports_as_stopped_without_an_error(tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith("KEYSHIFT_")}
    env.update(KEYSHIFT_HOME=str(tmp_path / "state"), KEYSHIFT_KAFKA_PORT=str(_free_port()),
               KEYSHIFT_REDIS_PORT=str(_free_port()), KEYSHIFT_AIRFLOW_PORT=str(_free_port()))
    result = subprocess.run([str(KEYSHIFT), "stack", "status"], env=env, capture_output=True, text=True, timeout=120, check=False)

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    states = [line.split()[1] for line in result.stdout.splitlines() if not line.startswith(" ")]
    assert states == ["stopped", "stopped", "stopped"]
