"""Cheap checks of the docs that need no MkDocs run (`make docs` builds the site with --strict).

The README stays a front page (at most about 250 lines) whose relative links all resolve, every
page named in mkdocs.yml's nav exists, and the settings reference hook renders every variable of
`infra/stack.env` and every field of `Settings`.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MKDOCS = ROOT / "mkdocs.yml"
DOCS = ROOT / "docs"

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _readme_links() -> list[str]:
    text = re.sub(r"```.*?```", "", README.read_text(), flags=re.S)  # no links inside code blocks
    return [target for target in LINK.findall(text) if not re.match(r"^[a-z]+://|^mailto:|^#", target)]


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 260, f"README.md has {len(lines)} lines; move detail to docs/"


@pytest.mark.parametrize("target", _readme_links())
def test_readme_link_resolves(target):
    path = (ROOT / target.split("#", 1)[0]).resolve()
    assert path.exists(), f"README.md links to {target}, which does not exist"


def test_readme_links_into_docs():
    assert any(target.startswith("docs/") for target in _readme_links())


def test_every_nav_page_exists():
    pages = re.findall(r"^\s*-\s+(?:[^:\n]+:\s+)?([\w./-]+\.md)\s*$", MKDOCS.read_text(), flags=re.M)
    assert len(pages) > 10
    missing = [page for page in pages if not (DOCS / page).is_file()]
    assert not missing, f"mkdocs.yml's nav names missing pages: {missing}"


def _settings_hook():
    spec = importlib.util.spec_from_file_location("settings_reference", DOCS / "hooks" / "settings_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_settings_reference_renders_every_variable_and_field():
    from keyshift.settings import Settings

    hook = _settings_hook()
    page = hook.on_page_markdown("<!-- keyshift:stack-env -->\n\n<!-- keyshift:settings -->", None, None, None)
    names = [line.partition("=")[0] for line in (ROOT / "infra" / "stack.env").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert names
    for name in names:
        assert f"| `{name}` |" in page
    for field in Settings.model_fields:
        assert f"| `KEYSHIFT_{field.upper()}` | `{field}` |" in page
    assert "<!-- keyshift:" not in page  # both markers replaced
