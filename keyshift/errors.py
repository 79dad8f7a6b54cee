"""The one exception hierarchy of keyshift.

Every error an operator can fix says what was wrong (the bad value) and how to fix it.
"""


class KeyshiftError(Exception):
    """Base of every error keyshift raises on purpose."""


class ConfigurationError(KeyshiftError):
    """A setting or argument has an invalid value."""


class StackError(KeyshiftError):
    """A local service (Kafka, Redis, Airflow) could not be started, reached or stopped."""


class DataError(KeyshiftError):
    """A real input could not be fetched, verified or read."""


class PlacementError(KeyshiftError):
    """A placement strategy got an input it cannot place (bad partitions, weights, keys)."""


class JobError(KeyshiftError):
    """A streaming job failed, stalled, or its results do not reconcile."""


class QualityError(KeyshiftError):
    """A run's outputs failed a data quality check (a Great Expectations suite), or could not be
    read to check them; the message names each failed expectation and a sample of its rows."""


class SwitchSkipped(ConfigurationError):
    """A switch decided by the balance monitor that no longer fits its run: the run is no longer
    running (it finished, failed, or its supervisor restarts it), or its placement (strategy, P)
    changed since the decision. Nothing was switched or recorded as a request.

    A ConfigurationError (the request does not fit the run, and a retry would not make it fit);
    the `keyshift_switch` DAG skips its task instead of failing it and writes the reason into the
    monitor's record of the decision. The monitor's next evaluation decides again.
    """


class SwitchNotReady(JobError):
    """A switch was asked of a run that is alive but has not started its query yet (its driver is
    starting, or a bounded run with `--wait-for-input` waits for its `--limit` records), so there
    is nothing to cut. Nothing was switched and nothing was written; ask again once the query runs.

    A JobError, not a ConfigurationError: the request is valid and the run exists, it is the run's
    state that is not ready, as for a switch lock held by another switch (also a JobError);
    ConfigurationError means "fix the request", which a retry would not. Callers that handle
    JobError as "this switch did not happen" stay right; those that care catch this first:
    `keyshift switch` exits 75 (EX_TEMPFAIL), the `keyshift_switch` DAG's task is skipped.
    """
