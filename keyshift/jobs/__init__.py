"""keyshift's jobs: each a `keyshift.processing.spec.JobSpec` run by the keyed window engine."""

from __future__ import annotations

from keyshift.errors import ConfigurationError
from keyshift.processing.spec import JobSpec


def job_spec(name: str) -> JobSpec:
    """The spec of the job called `name`.

    Raises:
        ConfigurationError: no such job.
    """
    from keyshift.jobs.flight_delays import FLIGHT_DELAYS

    jobs = {FLIGHT_DELAYS.name: FLIGHT_DELAYS}
    if name not in jobs:
        raise ConfigurationError(f"unknown job {name!r}; keyshift runs {', '.join(sorted(jobs))}")
    return jobs[name]
