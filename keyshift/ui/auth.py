"""The keyshift page's login check: the same login as the rest of the Airflow UI.

Airflow does not protect a plugin's FastAPI app, so every route of `keyshift.ui.app` depends on
`require_user`, which does what Airflow's own `get_user` dependency does
(`airflow.api_fastapi.core_api.security`):

1. the token is the `Authorization: Bearer <JWT>` header when given, else the `_token` cookie
   the UI's login page sets (`COOKIE_NAME_JWT_TOKEN`), which the browser sends to the page
   because it is served by the same api-server;
2. the token is checked by the configured auth manager (`resolve_user_from_token`: signature,
   expiry, issuer and audience of the api-server's JWT secret, then `get_user_from_token`);
3. the user must be allowed the UI itself (`is_authorized_view(AccessView.WEBSITE)`).

No token, or a token the auth manager refuses, is `LoginRequired` (the app answers 401, or
redirects a browser to the auth manager's login page and back); a user without the view is
`AccessDenied` (403).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request

TOKEN_COOKIE = "_token"
"""The cookie holding the UI's JWT (Airflow's `COOKIE_NAME_JWT_TOKEN`)."""


class LoginRequired(Exception):
    """The request carries no token, or one the auth manager refuses (why: the message)."""


class AccessDenied(Exception):
    """The logged-in user may not see the Airflow UI (`AccessView.WEBSITE`)."""


@dataclass(frozen=True)
class Login:
    """How tokens are checked: three functions, Airflow's by default (`airflow_login`).

    Attributes:
        resolve: `await resolve(token) -> user`; raises an exception with `status_code` 401 or
            403 (FastAPI's HTTPException) for a missing, expired or invalid token.
        allowed: `allowed(user) -> bool`: may the user see the UI.
        login_url: `login_url(next_url) -> str`: the login page that returns to `next_url`.
    """

    resolve: Callable[[str], Awaitable[Any]]
    allowed: Callable[[Any], bool]
    login_url: Callable[[str], str]


def airflow_login() -> Login:
    """The api-server's own check: Airflow's `resolve_user_from_token` and its auth manager.

    Only callable inside the api-server (or after `init_auth_manager`): the auth manager is the
    process's singleton.
    """
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import resolve_user_from_token

    def allowed(user: Any) -> bool:
        return bool(get_auth_manager().is_authorized_view(access_view=AccessView.WEBSITE, user=user))

    def login_url(next_url: str) -> str:
        return get_auth_manager().get_url_login(next_url=next_url)

    return Login(resolve_user_from_token, allowed, login_url)


def request_token(request: Request) -> str | None:
    """The request's JWT: `Authorization: Bearer <token>` first (as Airflow's `get_user`), else the `_token` cookie."""
    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return request.cookies.get(TOKEN_COOKIE) or None


async def check_request(request: Request, login: Login) -> Any:
    """The user a request is made by.

    Returns:
        The auth manager's user object.

    Raises:
        LoginRequired: no token, or the auth manager refused it (expired, bad signature, unknown user).
        AccessDenied: the user may not see the UI.
    """
    token = request_token(request)
    if token is None:
        raise LoginRequired("not logged in: no Authorization header and no _token cookie")
    try:
        user = await login.resolve(token)
    except Exception as exc:
        if getattr(exc, "status_code", None) in (401, 403):
            raise LoginRequired(f"the token was refused: {getattr(exc, 'detail', exc)}") from exc
        raise
    if not login.allowed(user):
        raise AccessDenied("this user may not see the Airflow UI")
    return user
