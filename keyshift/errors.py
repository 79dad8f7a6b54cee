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
