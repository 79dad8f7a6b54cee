"""Plugin integrity: plugins/ loads through Airflow's own plugins manager, declares the keyshift
page (a FastAPI app under /keyshift and a navigation entry), and does nothing at import.

The same policy as the DAG files (`test_dag_integrity.py`): importing a plugin file opens no
socket, starts no process, writes no file, and here also builds nothing: the page's app, FastAPI
routes, matplotlib and the Redis client are imported only at the page's first request. Each check
runs in a fresh interpreter, since Airflow's plugins manager caches what it loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from import_probe import closed_services_env, probe_import

REPO = Path(__file__).resolve().parents[2]
PLUGINS_DIR = REPO / "plugins"
PLUGIN_FILES = sorted(p for p in PLUGINS_DIR.glob("*.py") if not p.name.startswith("_"))


def _env(tmp_path: Path) -> dict[str, str]:
    """Airflow in a scratch home reading this checkout's plugins; keyshift's services on closed ports."""
    return closed_services_env(tmp_path, AIRFLOW__CORE__PLUGINS_FOLDER=str(PLUGINS_DIR))


def _python(code: str, env: dict[str, str], cwd: Path) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=180, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_plugins_folder_has_the_keyshift_plugin():
    assert [p.name for p in PLUGIN_FILES] == ["keyshift_ui.py"], f"plugin files in {PLUGINS_DIR}: {PLUGIN_FILES}"


def test_airflow_loads_the_page_and_its_navigation_entry(tmp_path):
    out = _python(
        """
        import json
        from airflow import plugins_manager
        apps, _ = plugins_manager.get_fastapi_plugins()
        views, react = plugins_manager._get_ui_plugins()
        print(json.dumps({
            "errors": plugins_manager.get_import_errors(),
            "apps": [{"prefix": a["url_prefix"], "name": a["name"], "type": type(a["app"]).__name__} for a in apps],
            "views": views,
        }))
        """,
        _env(tmp_path), tmp_path,
    )
    loaded = json.loads(out.strip().splitlines()[-1])
    assert loaded["errors"] == {}, loaded["errors"]
    assert loaded["apps"] == [{"prefix": "/keyshift", "name": "keyshift", "type": "LazyApp"}]
    (view,) = loaded["views"]
    assert view["url_route"] == "keyshift" and view["destination"] == "nav" and view["nav_top_level"] is True
    assert view["href"] == "keyshift/", "external views take a path relative to the UI's base URL"


HEAVY_PACKAGES = ("matplotlib", "redis", "pandas", "pyspark")
"""Packages only the page's first request may import."""


@pytest.mark.parametrize("path", PLUGIN_FILES, ids=[p.name for p in PLUGIN_FILES])
def test_import_does_no_work(path, tmp_path):
    env = _env(tmp_path)
    subprocess.run([sys.executable, "-c", "import airflow.plugins_manager"], env=env, capture_output=True, timeout=120)  # writes airflow.cfg
    probe = probe_import(path, env, tmp_path, folders=("plugins", "keyshift"), preimport="airflow.plugins_manager")
    assert not probe.io, f"importing {path.name} did I/O:\n" + "\n".join(probe.io)
    heavy = [m for m in probe.new_modules if m.split(".")[0] in HEAVY_PACKAGES or m == "keyshift.ui.app"]
    assert not heavy, f"importing {path.name} imported what only the page's first request needs: {heavy}"
    assert not (tmp_path / "absent-runs").exists()
