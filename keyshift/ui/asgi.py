"""`LazyApp`: the ASGI app the plugin mounts, which builds the real app on its first request.

Airflow imports plugin files in every component that loads plugins (api-server, scheduler,
dag-processor, triggerer), and a plugin declares its FastAPI app as an object at import. This
module imports only the standard library, so importing the plugin connects to nothing, reads
nothing and imports neither FastAPI, matplotlib nor redis; `keyshift.ui.app.create_app` runs, in
a worker thread, when the api-server hands the mount its first HTTP request.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class LazyApp:
    """An ASGI app that builds its app with `factory` the first time it is called.

    Args:
        factory: `"module:function"`, a function returning an ASGI app (default: the keyshift page).
            Nothing is imported until the first request; a factory that cannot be imported then
            raises there (ImportError, AttributeError), and every request tries again.
    """

    def __init__(self, factory: str = "keyshift.ui.app:create_app") -> None:
        self.factory = factory
        self._app: Callable[[Scope, Receive, Send], Awaitable[None]] | None = None
        self._lock = threading.Lock()

    def build(self) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
        """The app, built once (thread-safe)."""
        with self._lock:
            if self._app is None:
                module, _, function = self.factory.partition(":")
                self._app = getattr(importlib.import_module(module), function)()
            return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection with the built app (building it off the event loop the first time)."""
        app = self._app or await asyncio.to_thread(self.build)
        await app(scope, receive, send)
