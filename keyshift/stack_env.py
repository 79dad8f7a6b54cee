"""The service settings file, `infra/stack.env`: the one place ports, topic names, the partition
count and the Redis key prefix are written.

`keyshift.settings` takes its defaults from it, `keyshift.names` its topic names and Redis prefix,
and docker-compose.yml reads it for interpolation and for the containers' environment (see the
file's header). It is kept to a syntax Docker Compose's dotenv parser and this module read alike:
`NAME=value` lines with a plain value, comment lines, blank lines. The file is read at import of
those modules (a small committed file; nothing is written).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from keyshift.errors import ConfigurationError

PROJECT_ROOT = Path(__file__).resolve().parents[1]
"""The repository checkout this package lives in (editable install; `/opt/keyshift` in the image)."""

STACK_ENV_FILE = PROJECT_ROOT / "infra" / "stack.env"
"""The service settings file."""

_LINE = re.compile(r"(?P<name>[A-Z][A-Z0-9_]*)=(?P<value>[A-Za-z0-9._:/@+-]*)")


def parse_stack_env(text: str, *, source: str = "stack.env") -> dict[str, str]:
    """The `NAME=value` pairs of a stack env file's text, in file order.

    Args:
        text: the file's content.
        source: the file's name, for error messages.

    Returns:
        {name: value}, values as written (strings).

    Raises:
        ConfigurationError: a line that is neither blank, a `#` comment nor `NAME=value` with a
            plain value (letters, digits, `._:/@+-`), or a name given twice.
    """
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _LINE.fullmatch(stripped)
        if match is None:
            raise ConfigurationError(f"{source}:{number}: {line!r} is not NAME=value with a plain value (no quotes, spaces or $)")
        if match["name"] in values:
            raise ConfigurationError(f"{source}:{number}: {match['name']} is set twice")
        values[match["name"]] = match["value"]
    return values


@functools.cache
def stack_values(path: Path = STACK_ENV_FILE) -> dict[str, str]:
    """The settings of the stack env file at `path` (cached per path; do not mutate the result).

    Raises:
        ConfigurationError: the file is missing or malformed (`parse_stack_env`).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise ConfigurationError(f"the service settings file {path} is missing; it is part of the repository") from error
    return parse_stack_env(text, source=str(path))


def stack_value(name: str, path: Path = STACK_ENV_FILE) -> str:
    """One setting of the stack env file, e.g. `stack_value("KEYSHIFT_KAFKA_PORT")` -> `"9092"`.

    Raises:
        ConfigurationError: the file is missing or malformed, or does not set `name`.
    """
    values = stack_values(path)
    if name not in values:
        raise ConfigurationError(f"{path} does not set {name}; add `{name}=...` to it")
    return values[name]


DEFAULT_PARTITIONS = int(stack_value("KEYSHIFT_PARTITIONS"))
"""P when nothing else says: the file's KEYSHIFT_PARTITIONS, the default of `Settings.partitions`
and of the `--partitions` options and the pipeline DAG's param that start a run."""
