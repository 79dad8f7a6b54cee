"""Plugin integrity: plugins/ loads through Airflow's own plugins manager, declares the keyshift
page (a FastAPI app under /keyshift and a navigation entry), and does nothing at import.

The same policy as the DAG files (`test_dag_integrity.py`): importing a plugin file opens no
socket, starts no process, writes no file, and here also builds nothing: the page's app, FastAPI
routes, matplotlib and the Redis client are imported only at the page's first request. Each check
runs in a fresh interpreter, since Airflow's plugins manager caches what it loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS_DIR = REPO / "plugins"
PLUGIN_FILES = sorted(p for p in PLUGINS_DIR.glob("*.py") if not p.name.startswith("_"))


def _env(tmp_path: Path) -> dict[str, str]:
    """Airflow in a scratch home reading this checkout's plugins; keyshift's services on closed ports."""
    return {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS_DIR),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "KEYSHIFT_KAFKA_PORT": "1",
        "KEYSHIFT_REDIS_PORT": "1",
        "KEYSHIFT_AIRFLOW_PORT": "1",
        "KEYSHIFT_RUNS_DIR": str(tmp_path / "absent-runs"),
        "KEYSHIFT_HOME": str(tmp_path / "absent-home"),
    }


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


# The audit hook sees every open/connect/spawn while the plugin file runs; an event counts when a
# frame of this repository (plugins/ or keyshift/) comes before any import machinery. Airflow is
# imported first, so its own set-up is not counted.
_PROBE = """
import importlib.util, os, sys
import airflow.plugins_manager  # Airflow's own import is not the plugin's
REPO_PREFIXES = tuple(os.path.join(sys.argv[2], d) + os.sep for d in ("plugins", "keyshift"))
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
ours = []

def caused_by_us():
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith("<frozen importlib"):
            return False
        if name.startswith(REPO_PREFIXES):
            return True
        frame = frame.f_back
    return False

def hook(event, args):
    text = None
    if event == "socket.connect":
        text = f"socket.connect {args[1]!r}"
    elif event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork"):
        text = f"{event} {args[:2]!r}"
    elif event == "open" and isinstance(args[0], (str, bytes)) and "__pycache__" not in str(args[0]):
        mode, flags = args[1], args[2] or 0
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags & WRITE_FLAGS):
            text = f"open for write {args[0]!r}"
    if text is not None and caused_by_us():
        ours.append(text)

before = set(sys.modules)
sys.addaudithook(hook)
spec = importlib.util.spec_from_file_location("plugin_under_test", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
new = sorted(set(sys.modules) - before)
for e in ours:
    print("IO:", e)
heavy = [m for m in new if m.split(".")[0] in ("matplotlib", "redis", "pandas", "pyspark") or m == "keyshift.ui.app"]
print("HEAVY:", ",".join(heavy))
"""


@pytest.mark.parametrize("path", PLUGIN_FILES, ids=[p.name for p in PLUGIN_FILES])
def test_import_does_no_work(path, tmp_path):
    env = _env(tmp_path)
    subprocess.run([sys.executable, "-c", "import airflow.plugins_manager"], env=env, capture_output=True, timeout=120)  # writes airflow.cfg
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(path), str(REPO)], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, f"importing {path.name} failed:\n{proc.stderr[-3000:]}"
    io_events = [line for line in proc.stdout.splitlines() if line.startswith("IO:")]
    assert not io_events, f"importing {path.name} did I/O:\n" + "\n".join(io_events)
    heavy = next(line for line in proc.stdout.splitlines() if line.startswith("HEAVY:")).removeprefix("HEAVY:").strip()
    assert heavy == "", f"importing {path.name} imported what only the page's first request needs: {heavy}"
    assert not (tmp_path / "absent-runs").exists()
