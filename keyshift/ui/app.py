"""The keyshift page's FastAPI app, mounted by the plugin under `/keyshift` on Airflow's api-server.

| route | answers |
| --- | --- |
| `GET /` | overview: topics with their assignment, the newest runs (HTML) |
| `GET /topics/{topic}` | a topic: assignment, balance degree of every strategy and consumer lag over time, its runs |
| `GET /runs/{run_id}` | a run: placement in force, per-slot load and task seconds per batch, monitor, switches, quality |
| `GET /runs/{run_id}/data_docs/{path}` | the run's Great Expectations Data Docs (files of `runs/<run_id>/data_docs/`) |
| `GET /api/runs`, `GET /api/runs/{run_id}` | the same facts as JSON, for scripts |

Every route requires the Airflow login (`keyshift.ui.auth`): without it a browser is redirected
to the login page (303) and any other client gets 401; a user the auth manager does not allow
the UI gets 403. Routes are plain functions: FastAPI runs them in its thread pool, so reading
Redis and drawing charts never blocks the api-server's event loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response

from keyshift.errors import ConfigurationError
from keyshift.settings import Settings
from keyshift.ui import pages
from keyshift.ui.auth import AccessDenied, Login, LoginRequired, airflow_login, check_request
from keyshift.ui.store import Reader
from keyshift.names import RunDir

URL_PREFIX = "/keyshift"
"""Where the plugin mounts the app on the api-server."""


def wants_html(request: Request) -> bool:
    """True for a browser's page request (GET, Accept names text/html, not under /api/)."""
    return (request.method == "GET" and "text/html" in request.headers.get("accept", "")
            and not request.url.path.removeprefix(request.scope.get("root_path", "")).startswith("/api/"))


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def create_app(settings: Callable[[], Settings] = Settings, login: Callable[[], Login] = airflow_login) -> FastAPI:
    """The keyshift page's app.

    Args:
        settings: makes the settings per request (default: `Settings()`, i.e. the api-server's
            `KEYSHIFT_*` environment, which the stack sets for every Airflow component).
        login: makes the login check once, at the first request (default: the api-server's
            auth manager, `keyshift.ui.auth.airflow_login`).

    Returns:
        A FastAPI app whose every route requires the login.
    """
    checks: list[Login] = []

    async def require_user(request: Request) -> Any:
        """Every route's dependency: the caller's Airflow user (raises LoginRequired or AccessDenied)."""
        if not checks:
            checks.append(login())
        return await check_request(request, checks[0])

    app = FastAPI(title="keyshift", docs_url=None, redoc_url=None, openapi_url=None, dependencies=[Depends(require_user)])

    @app.exception_handler(LoginRequired)
    async def _login_required(request: Request, exc: LoginRequired) -> Response:
        if wants_html(request) and checks:
            return RedirectResponse(checks[0].login_url(str(request.url)), status_code=303)
        return JSONResponse({"detail": str(exc)}, status_code=401, headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(AccessDenied)
    async def _access_denied(request: Request, exc: AccessDenied) -> Response:
        return JSONResponse({"detail": str(exc)}, status_code=403)

    @app.exception_handler(ConfigurationError)
    async def _not_found(request: Request, exc: ConfigurationError) -> Response:
        if wants_html(request):
            return HTMLResponse(pages.document("keyshift: not found", f"<h1>not found</h1><p>{pages.esc(exc)}</p>"), status_code=404)
        return JSONResponse({"detail": str(exc)}, status_code=404)

    def reader() -> Reader:
        """A reader of Redis and the runs folder for one request."""
        return Reader.from_settings(settings())

    @app.get("/", response_class=HTMLResponse)
    def overview() -> str:
        """The overview page (HTML)."""
        return pages.overview_page(reader().overview())

    @app.get("/topics/{topic}", response_class=HTMLResponse)
    def topic(topic: str) -> str:
        """A topic's page (HTML)."""
        return pages.topic_page(reader().topic(topic, runs=50))

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    def run(run_id: str) -> str:
        """A run's page (HTML); 404 for an unknown run."""
        return pages.run_page(reader().run(run_id))

    @app.get("/runs/{run_id}/data_docs/{path:path}")
    def data_docs(run_id: str, path: str) -> FileResponse:
        """A file of the run's Data Docs; 404 for anything outside `runs/<run_id>/data_docs/`."""
        runs_dir = settings().runs_dir.resolve()
        base = RunDir.of(runs_dir, run_id).data_docs.resolve()
        target = (base / (path or "index.html")).resolve()
        if run_id.startswith(".") or base.parent.parent != runs_dir or not target.is_relative_to(base) or not target.is_file():
            raise HTTPException(status_code=404, detail=f"no Data Docs file {path!r} for run {run_id!r}")
        return FileResponse(target)

    @app.get("/api/runs")
    def runs_json(topic: str | None = None, limit: int = Query(50, ge=1, le=1000)) -> Any:
        """The newest `limit` runs (of `topic`), as `RunRow` objects."""
        return _jsonable(reader().runs(topic, limit))

    @app.get("/api/runs/{run_id}")
    def run_json(run_id: str) -> Any:
        """A run's `RunView` with the monitor records about it (the topic's own series left out)."""
        view = reader().run(run_id)
        return _jsonable({**dataclasses.asdict(view), "monitor": view.monitor,
                          "topic": None if view.topic is None else {**dataclasses.asdict(view.topic), "monitor": None}})

    return app
