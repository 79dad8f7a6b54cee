"""The `keyshift` command: a thin front over the package, one click group per area.

Each sub-module defines one group or command; `main` assembles them.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from keyshift.errors import KeyshiftError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG level.")
def cli(verbose: bool) -> None:
    """keyshift: keyed streaming analytics on Spark over Kafka, kept balanced."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:  # py4j logs every JVM call at INFO; kafka-python every reconnect
        logging.getLogger("py4j").setLevel(logging.WARNING)
        # kafka-python logs each failed connection at ERROR while it retries; the command's own
        # one-line error says what failed (-v shows them)
        logging.getLogger("kafka").setLevel(logging.CRITICAL)


def _register() -> None:
    from keyshift.cli import balance, bench, data, dq, job, package, replay, run, stack, switch, topics

    for module in (stack, package, data, topics, replay, job, run, bench, balance, dq, switch):
        cli.add_command(module.command)


def main() -> None:
    """Entry point of the `keyshift` console script.

    Every failure a user can fix ends in one line on stderr, `error: <problem>; <fix>`, and exit
    status 1 (2 for wrong arguments, 130 for Ctrl-C): a KeyshiftError with its message, a wrong
    argument or option with the command's `--help`, an invalid `KEYSHIFT_*` variable with its
    name, and, as a last resort, a Kafka or Redis client error that no check caught earlier.
    Anything else is a bug and keeps its traceback. When the failing command had started a run
    whose log is `runs/<run_id>/driver.log` (`keyshift.runlog`), the line ends with
    `; details in <that file>`, and the traceback is written there.

    Before the command runs, a local Spark master gets `SPARK_LOCAL_IP=127.0.0.1` (unless set),
    so a job's driver and Spark UI listen on loopback only.
    """
    _register()
    _bind_spark_to_loopback()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx is not None else "keyshift"
        click.echo(f"error: {exc.format_message().rstrip('.')}; see `{command} --help`", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}{_see_driver_log(exc)}", err=True)
        sys.exit(exc.exit_code)
    except KeyshiftError as exc:
        click.echo(f"error: {exc}{_see_driver_log(exc)}", err=True)
        sys.exit(1)
    except Exception as exc:
        message = _known_failure(exc)
        hint = _see_driver_log(exc)
        if message is None:
            if hint:
                click.echo(f"error: {type(exc).__name__}{hint}", err=True)
            raise
        click.echo(f"error: {message}{hint}", err=True)
        sys.exit(1)


def _see_driver_log(exc: BaseException) -> str:
    """`; details in <driver log>` when a run's driver log is attached (`keyshift.runlog`), after
    writing `exc` with its traceback there; else an empty string."""
    from keyshift import runlog

    path = runlog.record_failure(exc)
    if path is None:
        return ""
    try:
        shown = path.relative_to(Path.cwd())
    except ValueError:
        shown = path
    return f"; details in {shown}"


def _bind_spark_to_loopback() -> None:
    """Set SPARK_LOCAL_IP for a local master (see `keyshift.stack.spark.bind_loopback`)."""
    from pydantic import ValidationError

    from keyshift.settings import Settings
    from keyshift.stack.spark import bind_loopback

    try:
        bind_loopback(Settings())
    except ValidationError:
        pass  # the command builds its Settings too and reports the bad variable there


def _known_failure(exc: Exception) -> str | None:
    """One line `<problem>; <fix>` for an exception from the environment, or None for a bug.

    Covers pydantic's ValidationError of `Settings` (a bad `KEYSHIFT_*` variable), kafka-python's
    errors of an unreachable broker, and redis-py's connection, timeout and login errors.
    """
    from kafka import errors as kafka_errors
    from pydantic import ValidationError
    from redis.exceptions import AuthenticationError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from keyshift.settings import Settings

    if isinstance(exc, ValidationError) and exc.title == Settings.__name__:
        problems = []
        for error in exc.errors():
            name = "KEYSHIFT_" + "_".join(str(part) for part in error["loc"]).upper()
            problems.append(f"{name}={error.get('input')!r}: {error['msg']}")
        return f"invalid setting {'; '.join(problems)}; fix or unset the environment variable"
    unreachable = tuple(
        getattr(kafka_errors, name)
        for name in ("NoBrokersAvailable", "KafkaTimeoutError", "KafkaConnectionError")
        if hasattr(kafka_errors, name)  # kafka-python 3 has no NoBrokersAvailable
    )
    if isinstance(exc, unreachable):
        return f"Kafka did not answer ({type(exc).__name__}: {exc}); check `keyshift stack status`, start it with `keyshift stack up`"
    if isinstance(exc, AuthenticationError):
        return f"Redis refused the login ({exc}); set KEYSHIFT_REDIS_PASSWORD to the server's password"
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
        return f"Redis did not answer ({exc}); check `keyshift stack status`, start it with `keyshift stack up`"
    return None
