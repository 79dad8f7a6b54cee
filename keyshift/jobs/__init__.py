"""keyshift's jobs: each a `keyshift.jobs.spec.JobSpec` run by the keyed window engine."""

from __future__ import annotations

from keyshift.errors import ConfigurationError
from keyshift.jobs.spec import JobSpec


def job_specs() -> dict[str, JobSpec]:
    """Every registered job: name -> spec (`flight_delays`, `flight_delays_sliding`, `ysb`)."""
    from keyshift.jobs.flight_delays import FLIGHT_DELAYS
    from keyshift.jobs.flight_delays_sliding import FLIGHT_DELAYS_SLIDING
    from keyshift.jobs.ysb import YSB

    return {spec.name: spec for spec in (FLIGHT_DELAYS, FLIGHT_DELAYS_SLIDING, YSB)}


def job_names() -> tuple[str, ...]:
    """The registered jobs' names, sorted (the choices of `keyshift job run --job`)."""
    return tuple(sorted(job_specs()))


def job_spec(name: str) -> JobSpec:
    """The spec of the job called `name`.

    Raises:
        ConfigurationError: no such job.
    """
    jobs = job_specs()
    if name not in jobs:
        raise ConfigurationError(f"unknown job {name!r}; keyshift runs {', '.join(sorted(jobs))}")
    return jobs[name]
