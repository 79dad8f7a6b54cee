"""Failpoints: named places where a test can make the driver die with SIGKILL, on purpose.

Crash tests must kill the driver at exact points of a micro-batch's life, which no outside
observer can hit reliably (the gap between two batches lasts milliseconds). As FoundationDB's
buggify and TiKV's fail-rs do, the code names those points and an environment variable arms one:

    KEYSHIFT_FAILPOINT=sink.after_outputs@5   keyshift job run flight_delays ...

kills the driver's whole process group (the Python driver, its JVM and the Python workers: what a
lost machine does) when batch 5 passes `sink.after_outputs`. Unset (always, outside tests),
`failpoint` is one dictionary lookup. The points:

| name | where | what a crash there leaves |
| --- | --- | --- |
| `sink.before_batch` | the sink, before it reads batch b | b-1 committed; b planned (offset log), nothing of b written |
| `sink.after_outputs` | the sink, after b's windows file, Kafka transaction and ledger | b's outputs all written, b not committed: Spark replays b |
| `sink.hold_after_outputs` (holds, does not kill) | the sink, after b's outputs (as above) | the sink returns `HOLD_SECONDS` later: a stop asked meanwhile comes while b is written and not committed |
| `side_outputs.hold_in_transaction` (holds, does not kill) | the sink's Kafka transaction of batch b, its records sent, before the offsets and the commit | the transaction stays open `HOLD_SECONDS`: a test kills a broker (its coordinator) meanwhile |
| `switch.<step>` (n = the run's n-th switch) | the driver, right after step `stopped`, `migrated`, `segment` or `published` of a switch | see `keyshift.migration.switch`: redone before the segment, finished after |
| `switch.new_query` (raises, does not kill) | the driver, once the new query of switch n started | the new query fails before its first commit: the switch rolls back |
| `switch.after_markers_read` (holds, does not kill) | the driver, when switch n is requested | the driver acts on it only once a completed batch has read the end-of-input markers: the next segment starts past them |
| `switch.hold_first_batch` (holds, does not kill) | the sink, after the outputs of switch n's new query's first batch | the sink returns `HOLD_SECONDS` later: a stop asked meanwhile comes after the switch's new query started and before its first commit |
| `switch.before_markers_batch` (holds, does not kill) | the driver, when switch n is requested; the sink, at the batch planned to the input's end | the driver acts on the switch only once it has written the end-of-input markers, and the sink holds that batch until the switch refuses it: the cut comes right before it, and the next segment finds the markers among its input |

Run the driver in its own process group (`start_new_session=True`, as the detached launcher
does), or the kill takes its parent with it.
"""

from __future__ import annotations

import logging
import os
import signal
import time

log = logging.getLogger(__name__)

FAILPOINT_ENV = "KEYSHIFT_FAILPOINT"


def armed() -> tuple[str, int] | None:
    """The armed failpoint `(name, batch_id)` from `KEYSHIFT_FAILPOINT=name@batch_id`, or None.

    Raises:
        ValueError: the variable is set but not of the form `name@batch_id`.
    """
    value = os.environ.get(FAILPOINT_ENV)
    if not value:
        return None
    name, sep, batch = value.partition("@")
    if not sep or not batch.isdigit():
        raise ValueError(f"{FAILPOINT_ENV}={value!r}: expected NAME@BATCH_ID, e.g. sink.after_outputs@5")
    return name, int(batch)


def failpoint(name: str, batch_id: int) -> None:
    """Kill this process group with SIGKILL if failpoint `name` is armed for `batch_id`."""
    if FAILPOINT_ENV not in os.environ:
        return
    if armed() == (name, batch_id):
        log.warning("failpoint %s@%d: killing the driver's process group with SIGKILL", name, batch_id)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.killpg(os.getpgrp(), signal.SIGKILL)


HOLD_SECONDS = 10.0
"""How long `hold_here` holds (seconds): long enough for a test to act while it does."""


def hold_here(name: str, batch_id: int) -> None:
    """Sleep `HOLD_SECONDS` if failpoint `name` is armed for `batch_id` (a race held open: the
    driver goes on meanwhile, e.g. it takes a stop request)."""
    if FAILPOINT_ENV in os.environ and armed() == (name, batch_id):
        hold(f"{name}@{batch_id}")


def hold(what: str) -> None:
    """Sleep `HOLD_SECONDS`, logging `what` (an armed failpoint) at WARNING."""
    log.warning("failpoint %s: holding for %.0f s", what, HOLD_SECONDS)
    time.sleep(HOLD_SECONDS)


class InjectedFailure(RuntimeError):
    """The failure a `fail_here` failpoint injects (a test's stand-in for a query that fails)."""


def fail_here(name: str, number: int) -> None:
    """Raise `InjectedFailure` if failpoint `name` is armed for `number` (a failure the process
    survives, unlike `failpoint`'s SIGKILL)."""
    if FAILPOINT_ENV in os.environ and armed() == (name, number):
        log.warning("failpoint %s@%d: injecting a failure", name, number)
        raise InjectedFailure(f"failpoint {name}@{number}")
