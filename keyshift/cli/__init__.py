"""The `keyshift` command: a thin front over the package, one click group per area.

Each sub-module defines one group or command; `main` assembles them.
"""

from __future__ import annotations

import logging
import sys

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
        for noisy in ("py4j", "kafka"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


def _register() -> None:
    from keyshift.cli import balance, bench, data, dq, job, replay, run, stack, topics

    for module in (stack, data, topics, replay, job, run, bench, balance, dq):
        cli.add_command(module.command)


def main() -> None:
    """Entry point of the `keyshift` console script; a KeyshiftError exits 1 with its message."""
    _register()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyshiftError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
