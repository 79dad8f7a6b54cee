"""The keyshift page's app without Airflow or Redis: every route needs a login, a browser is sent
to the login page, the pages render from a run folder alone, Data Docs cannot leave their folder.

The login is a stand-in `Login` (token "good" is user "admin", "viewer" may not see the UI);
`tests/integration/test_ui_plugin.py` checks the same behaviour with the api-server's auth manager.
"""

from __future__ import annotations

import json

import pytest
from fastapi import HTTPException
from fastapi.testclient import TestClient

from keyshift.settings import Settings
from keyshift.ui.app import create_app
from keyshift.ui.auth import Login

RUN = "unit-run"


async def resolve(token: str) -> str:
    if token not in ("good", "viewer"):
        raise HTTPException(status_code=403, detail="Invalid JWT token")
    return token


def fake_login() -> Login:
    return Login(resolve, lambda user: user == "good", lambda next_url: f"/auth/login?next={next_url}")


@pytest.fixture
def client(tmp_path):
    run_dir = tmp_path / "runs" / RUN
    (run_dir / "data_docs").mkdir(parents=True)
    (run_dir / "data_docs" / "index.html").write_text("<html>Data Docs of the unit run</html>")
    (tmp_path / "runs" / "secret.txt").write_text("not for the page")
    (tmp_path / "data_docs").mkdir()
    (tmp_path / "data_docs" / "index.html").write_text("beside the runs folder: not for the page")
    records = [{"batch_id": b, "processed_rows_per_slot": [10 * (b + 1), 5], "strategy": "hash", "epoch": 0, "segment": 0,
                "timestamp_ms": 1_000 * b} for b in range(3)]
    (run_dir / "progress.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "summary.json").write_text(json.dumps({"run_id": RUN, "topic": "unit-topic", "strategy": "hash", "partitions": 2,
                                                      "events_read": 75, "balance_degree": 0.25, "late_events": 7, "dead_letters": 2,
                                                      "dead_letters_by_reason": {"bad json": 2}, "pending_events": 0,
                                                      "windows_emitted": 4}))
    (run_dir / "quality.json").write_text(json.dumps({"success": True, "suites": [{"suite": "flight_delay_windows", "success": True,
                                                                                      "rows": 3, "evaluated": 20, "failed": []}]}))
    settings = Settings(runs_dir=tmp_path / "runs", redis_port=1)  # no Redis: the page says so and reads the folder
    app = create_app(lambda: settings, fake_login)
    return TestClient(app, base_url="http://testserver/keyshift", root_path="/keyshift")


@pytest.mark.parametrize("path", ["/", f"/runs/{RUN}", "/topics/unit-topic", f"/runs/{RUN}/data_docs/index.html", "/api/runs"])
def test_without_a_token_a_browser_goes_to_the_login_page_and_a_script_gets_401(client, path):
    page = client.get(path, headers={"accept": "text/html"}, follow_redirects=False)
    if path.startswith("/api/"):  # JSON for scripts: never a redirect
        assert page.status_code == 401
    else:
        assert page.status_code == 303 and page.headers["location"] == f"/auth/login?next=http://testserver/keyshift{path}"
    script = client.get(path, follow_redirects=False)
    assert script.status_code == 401 and script.headers["www-authenticate"] == "Bearer"


def test_a_refused_token_is_401_and_a_user_without_the_ui_is_403(client):
    assert client.get("/api/runs", headers={"authorization": "Bearer forged"}).status_code == 401
    assert client.get("/api/runs", cookies={"_token": "forged"}).status_code == 401
    assert client.get("/api/runs", headers={"authorization": "Bearer viewer"}).status_code == 403


def test_the_bearer_header_wins_over_the_cookie(client):
    assert client.get("/api/runs", headers={"authorization": "Bearer good"}, cookies={"_token": "forged"}).status_code == 200
    assert client.get("/api/runs", headers={"authorization": "Bearer forged"}, cookies={"_token": "good"}).status_code == 401


def test_pages_render_from_the_run_folder_without_redis(client):
    client.cookies.set("_token", "good")
    overview = client.get("/")
    assert overview.status_code == 200 and RUN in overview.text and "not reachable" in overview.text
    assert '<tr class="attention">' in overview.text and "⚠ 7 late events; 2 dead letters" in overview.text
    assert "2 <span class=\"muted\">(bad json: 2)</span>" in overview.text  # the dead letters with their reasons
    run = client.get(f"/runs/{RUN}")
    assert run.status_code == 200
    assert "hash, P = 2, epoch 0" in run.text and "<svg" in run.text and "passed" in run.text
    assert f'href="./{RUN}/data_docs/index.html"' in run.text
    assert client.get(f"/runs/{RUN}/data_docs/index.html").text == "<html>Data Docs of the unit run</html>"
    view = client.get(f"/api/runs/{RUN}").json()
    assert view["in_force"]["strategy"] == "hash" and [b["slot_events"] for b in view["batches"]][-1] == [30, 5]


@pytest.mark.parametrize("path", [f"/runs/{RUN}/data_docs/../../secret.txt", f"/runs/{RUN}/data_docs/%2e%2e/%2e%2e/secret.txt",
                                  "/runs/%2E%2E/data_docs/index.html", f"/runs/{RUN}/data_docs/absent.html", "/runs/absent-run"])
def test_unknown_runs_and_files_outside_data_docs_are_404(client, path):
    client.cookies.set("_token", "good")
    assert client.get(path).status_code == 404
