"""`keyshift switch`: move a running job to another strategy (and P), its state migrated.

    keyshift switch --run RUN_ID --strategy least_count [--partitions 12]
    keyshift switch --run RUN_ID            # finish a switch left unfinished (its driver died)
    keyshift switch --run RUN_ID --history  # the run's switches

Prints one line per step as the driver carries it out (seconds since the request, switch, state,
step), then the pause, the state moved and the moved share against the minimum. Exits 1 with `error: ...` if the switch fails or rolls back.
Exits `EXIT_NOT_READY` (75) with `error: run … has not started its query yet …` when the run is
alive but its query has not started (nothing was switched; ask again later).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from keyshift.migration.switch_record import SwitchRecord

EXIT_NOT_READY = 75
"""Exit status of `keyshift switch` when the run has not started its query yet (sysexits.h's
EX_TEMPFAIL: a temporary failure, the same request may succeed later); nothing was switched."""


class NotReady(click.ClickException):
    """`keyshift.errors.SwitchNotReady` as the command's outcome: `error: <its message>` on stderr
    (`keyshift.cli.main` prints a ClickException so) and exit status `EXIT_NOT_READY`."""

    exit_code = EXIT_NOT_READY


def _describe(record: SwitchRecord) -> str:
    plan = record.plan or {}
    migration = record.migration or {}
    return (
        f"switch {record.switch_id}: {record.strategy_from}/P={record.partitions_from} -> "
        f"{record.strategy_to}/P={record.partitions_to}, epoch {record.epoch_from} -> {record.epoch_to}, "
        f"pause {record.pause_seconds if record.pause_seconds is not None else '?'} s, state rows {sum(migration.get('state_rows_written', {}).values())}, "
        f"{migration.get('state_bytes_moved', 0):,} of {migration.get('state_bytes', 0):,} state bytes moved, "
        f"moved share {plan.get('moved_share', 0):.3f} (minimum {plan.get('min_moved_share', 0):.3f}), "
        f"in driver: {record.in_driver}"
    )


@click.command(name="switch")
@click.option("--run", "run_id", required=True, help="The running job's run id.")
@click.option("--strategy", default=None, help="Strategy to move to (hash, modulo, least_key, least_count, hot_split).")
@click.option("--partitions", type=click.IntRange(min=1), default=None, help="New P (slots); default: keep P.")
@click.option("--reason", default="requested by hand", show_default=True, help="Why, recorded with the switch.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=600.0, show_default=True, help="Seconds to wait for it.")
@click.option("--history", is_flag=True, help="Print the run's switches (JSON lines, newest first) and exit.")
def command(run_id: str, strategy: str | None, partitions: int | None, reason: str, timeout_s: float, history: bool) -> None:
    """Switch run RUN_ID's placement with its state migrated, exactly once (or finish one).

    Exit status: 0 switched; 1 the switch failed, rolled back or was refused (an unknown or
    ended run, another switch under way); 75 (EX_TEMPFAIL) the run is alive but has not started
    its query yet (starting, or a bounded run waiting for its --limit records): nothing was
    switched, run the command again once its query runs.
    """
    from keyshift.errors import SwitchNotReady
    from keyshift.migration.switch import SwitchControl, request_switch
    from keyshift.settings import Settings

    settings = Settings()
    if history:
        for record in SwitchControl.from_settings(settings, run_id).history():
            click.echo(json.dumps({k: v for k, v in record.as_json().items() if k not in ("mapping", "mapping_from")}, sort_keys=True))
        return

    started = time.monotonic()

    def show(record: SwitchRecord) -> None:
        click.echo(f"  {time.monotonic() - started:6.1f} s  {record.switch_id}: {record.state} at step {record.step}")

    try:
        record = request_switch(settings, run_id, strategy, partitions, reason=reason, wait_timeout_s=timeout_s, on_update=show)
    except SwitchNotReady as exc:
        raise NotReady(str(exc)) from exc
    click.echo(_describe(record))
