"""The options and terminal set-up shared by the commands that run a job: `keyshift job run`
and `keyshift run demo` (see `keyshift.console` and `keyshift.runlog`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click


def run_output_options(function):
    """`--json` (the summary as JSON instead of the table) and `--progress/--no-progress`."""
    function = click.option("--progress/--no-progress", default=True,
                            help="Show progress bars (events replayed, events accounted for) on stderr.")(function)
    function = click.option("--json", "as_json", is_flag=True,
                            help="Print the summary as JSON instead of the table (it is in runs/<run_id>/summary.json either way).")(function)
    return function


@contextmanager
def run_terminal() -> Iterator[None]:
    """While a run goes on, the terminal shows its steps, warnings and progress bars; every other
    log line goes to the run's driver log only (unless `keyshift -v`, which shows them all).
    Log lines are written above the progress bars (tqdm's `logging_redirect_tqdm`)."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    from keyshift.console import show_steps_and_warnings

    show_steps_and_warnings()
    with logging_redirect_tqdm():
        yield
