"""What every local service reports: one status value, the same shape for Kafka, Redis and Airflow."""

from __future__ import annotations

from dataclasses import dataclass, field

HEALTHY = "healthy"
"""Started by keyshift, its processes run, and it answers its health check."""
UNHEALTHY = "unhealthy"
"""Started by keyshift and (partly) running, but it does not answer its health check (yet)."""
STOPPED = "stopped"
"""Nothing of keyshift's runs and nothing answers on the service's address."""
EXTERNAL = "external"
"""Something answers on the service's address that keyshift did not start (e.g. docker compose)."""
BLOCKED = "port in use"
"""Something that is not the service listens on its port; keyshift cannot start it there."""


@dataclass(frozen=True)
class ProcessState:
    """One supervised process of a service: its name, its pid when running, and its log file."""

    name: str
    pid: int | None
    log_file: str


@dataclass(frozen=True)
class ServiceStatus:
    """The state of one service of the local stack, as `keyshift stack status` prints it.

    Attributes:
        name: `kafka`, `redis` or `airflow`.
        state: one of HEALTHY, UNHEALTHY, STOPPED, EXTERNAL, BLOCKED (module constants).
        address: where clients reach it (`127.0.0.1:9092`, `redis://...`, `http://...`).
        processes: the supervised processes behind it (Airflow has four).
        detail: one line of extra facts (cluster id, version, login), '' when none.
    """

    name: str
    state: str
    address: str
    processes: tuple[ProcessState, ...] = field(default_factory=tuple)
    detail: str = ""

    @property
    def up(self) -> bool:
        """True when the service answers (started by keyshift or not)."""
        return self.state in (HEALTHY, EXTERNAL)
