"""What importing one file of dags/ or plugins/ does, seen from a fresh interpreter.

`probe_import(path, ...)` imports the file in a child `python` with an audit hook installed first
and reports every socket connect, process start and file opened for writing. An event counts as
the file's own I/O when, walking the stack outward from it, a frame of this repository (the given
folders, e.g. dags/ and keyshift/) comes before any import machinery: code of ours ran it. An event
raised while a third-party module executes its own top level on first import (Airflow lazily
imports croniter, which runs `file -b python` to learn the word size) is that library's set-up,
not ours, and is reported apart. Used by `test_dag_integrity.py` and `test_plugin_integrity.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_PROBE = """
import importlib, importlib.util, json, os, sys, time
path, repo, folders, preimport = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4]
if preimport:
    importlib.import_module(preimport)  # Airflow's own set-up is not the file's
REPO_PREFIXES = tuple(os.path.join(repo, d) + os.sep for d in folders)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
ours, theirs = [], []

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

def describe(event, args):
    if event == "socket.connect":
        return f"socket.connect {args[1]!r}"
    if event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork"):
        return f"{event} {args[:2]!r}"
    if event == "open" and isinstance(args[0], (str, bytes)) and "__pycache__" not in str(args[0]):
        mode, flags = args[1], args[2] or 0
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags & WRITE_FLAGS):
            return f"open for write {args[0]!r}"
    return None

def hook(event, args):
    text = describe(event, args)
    if text is not None:
        (ours if caused_by_us() else theirs).append(text)

before = set(sys.modules)
sys.addaudithook(hook)
start = time.monotonic()
spec = importlib.util.spec_from_file_location("file_under_test", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
elapsed = time.monotonic() - start
print("PROBE " + json.dumps({"ours": ours, "theirs": theirs, "elapsed_s": elapsed,
                             "new_modules": sorted(set(sys.modules) - before)}))
"""


@dataclass(frozen=True)
class ImportProbe:
    """What importing a file did.

    Attributes:
        io: the file's own I/O events (text lines), empty when it did none.
        third_party_io: I/O by third-party modules' first import while the file was imported.
        elapsed_s: seconds the import took (after `preimport` was loaded).
        new_modules: module names imported by the file, sorted.
        wall_s: seconds the whole child interpreter ran.
    """

    io: list[str]
    third_party_io: list[str]
    elapsed_s: float
    new_modules: list[str]
    wall_s: float


def closed_services_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An environment for Airflow in a scratch home (`tmp_path/airflow`) with keyshift's services on
    closed port 1 and runs/home folders that do not exist (`tmp_path/absent-runs`,
    `tmp_path/absent-home`), so a connection attempt fails too; `extra` adds variables."""
    return {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "KEYSHIFT_KAFKA_PORT": "1",
        "KEYSHIFT_REDIS_PORT": "1",
        "KEYSHIFT_AIRFLOW_PORT": "1",
        "KEYSHIFT_RUNS_DIR": str(tmp_path / "absent-runs"),
        "KEYSHIFT_HOME": str(tmp_path / "absent-home"),
        **extra,
    }


def probe_import(path: Path, env: dict[str, str], cwd: Path, folders: tuple[str, ...], preimport: str = "",
                 timeout_s: float = 120.0) -> ImportProbe:
    """Import `path` in a fresh interpreter and report what it did (module docstring).

    Args:
        path: the DAG or plugin file. env: the child's environment (`closed_services_env`).
        cwd: the child's working directory. folders: repository folders whose code counts as
            ours, e.g. ("dags", "keyshift"). preimport: a module imported before the hook is
            installed ("" for none). timeout_s: the child's wall-time limit, seconds.

    Raises:
        AssertionError: the import failed (the child's stderr is the message).
        subprocess.TimeoutExpired: the child ran longer than `timeout_s`.
    """
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(path), str(REPO), ",".join(folders), preimport],
                          env=env, capture_output=True, text=True, timeout=timeout_s, cwd=cwd)
    wall = time.monotonic() - started
    assert proc.returncode == 0, f"importing {path.name} failed:\n{proc.stderr[-3000:]}"
    line = next(line for line in proc.stdout.splitlines() if line.startswith("PROBE "))
    found = json.loads(line.removeprefix("PROBE "))
    return ImportProbe(found["ours"], found["theirs"], found["elapsed_s"], found["new_modules"], wall)
