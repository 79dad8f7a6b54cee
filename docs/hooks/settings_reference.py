"""MkDocs hook: the settings reference is generated at build time, so it cannot drift.

In a page, the line `<!-- keyshift:stack-env -->` becomes a table of `infra/stack.env` (every
variable, its value and the comment above it), and `<!-- keyshift:settings -->` a table of
`keyshift.settings.Settings` (every field, its `KEYSHIFT_*` variable, its default and the text of
the class docstring's `Attributes:` section).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STACK_ENV = ROOT / "infra" / "stack.env"


def _cell(text: str) -> str:
    """One table cell: one line, `|` escaped, `<` and `>` escaped outside code spans."""
    pieces = " ".join(text.split()).replace("|", "\\|").split("`")
    for i in range(0, len(pieces), 2):  # even pieces are outside backticks
        pieces[i] = pieces[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(pieces)


def stack_env_rows() -> list[tuple[str, str, str]]:
    """(name, value, comment) of every `NAME=value` line of `infra/stack.env`.

    The comment is the block of `#` lines right above the variable (or above the run of variables
    it belongs to); the file's header block (the first one, followed by a blank line) is left out.
    """
    rows: list[tuple[str, str, str]] = []
    comment: list[str] = []
    group = ""
    for line in STACK_ENV.read_text().splitlines():
        stripped = line.strip()
        if not stripped:
            comment, group = [], ""  # a blank line ends a comment block or a run of variables
        elif stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
        else:
            name, _, value = stripped.partition("=")
            if comment:
                group, comment = " ".join(comment), []
            rows.append((name, value, group))
    return rows


def stack_env_table() -> str:
    lines = ["| variable | value | what |", "| --- | --- | --- |"]
    for name, value, comment in stack_env_rows():
        lines.append(f"| `{name}` | `{value}` | {_cell(comment)} |")
    return "\n".join(lines)


def _attribute_docs(doc: str) -> dict[str, str]:
    """Field name -> text, from a Google-style `Attributes:` section (`a, b: text`, indented more
    on continuation lines)."""
    docs: dict[str, str] = {}
    section = doc.split("Attributes:", 1)[1] if "Attributes:" in doc else ""
    names: list[str] = []
    for line in section.splitlines():
        match = re.match(r"^\s{8}([a-z_][a-z0-9_, ]*):\s+(.*)$", line)
        if match:
            names = [n.strip() for n in match.group(1).split(",")]
            for name in names:
                docs[name] = match.group(2)
        elif line.startswith(" " * 12) and names:
            for name in names:
                docs[name] += " " + line.strip()
        elif line.strip() == "" or not line.startswith(" " * 8):
            if line.strip():  # the text after the section
                break
            names = []
    return docs


def _default(field, stack_names: set[str], env: str) -> str:
    from keyshift.stack_env import PROJECT_ROOT

    default = field.default
    if default is None:
        return "unset"
    if isinstance(default, Path):
        try:
            return f"`{default.relative_to(PROJECT_ROOT)}`"
        except ValueError:
            return f"`{default}`"
    text = f"`{default}`"
    if env in stack_names:
        text += " (`infra/stack.env`)"
    return text


def settings_table() -> str:
    from keyshift.settings import Settings

    docs = _attribute_docs(Settings.__doc__ or "")
    prefix = Settings.model_config.get("env_prefix", "")
    stack_names = {name for name, _, _ in stack_env_rows()}
    lines = ["| variable | field | default | what |", "| --- | --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        env = f"{prefix}{name}".upper()
        lines.append(f"| `{env}` | `{name}` | {_default(field, stack_names, env)} | {_cell(docs.get(name, ''))} |")
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):
    if "<!-- keyshift:stack-env -->" in markdown:
        markdown = markdown.replace("<!-- keyshift:stack-env -->", stack_env_table())
    if "<!-- keyshift:settings -->" in markdown:
        markdown = markdown.replace("<!-- keyshift:settings -->", settings_table())
    return markdown
