"""Airflow plugin: the keyshift page in the Airflow UI (Airflow 3.1+ plugin interface, no Flask).

* `fastapi_apps`: the page's FastAPI app, mounted by the api-server under `/keyshift`
  (`keyshift.ui.app`: overview, topics, runs, Data Docs, JSON);
* `external_views`: a "keyshift" entry in the UI's navigation that shows `/keyshift/` inside the
  UI (`url_route` keyshift: the UI's address becomes `/plugin/keyshift`).

The app checks the Airflow login itself (`keyshift.ui.auth`): Airflow does not protect plugin
apps. This file only declares: the app is a `keyshift.ui.asgi.LazyApp`, built on its first
request, so importing the plugin (every Airflow component does) does no work.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from keyshift.ui.asgi import LazyApp

URL_PREFIX = "/keyshift"


class KeyshiftUIPlugin(AirflowPlugin):
    """The keyshift page: per topic and run, placement, load, balance, switches and data quality."""

    name = "keyshift"
    fastapi_apps = [{"app": LazyApp("keyshift.ui.app:create_app"), "url_prefix": URL_PREFIX, "name": "keyshift"}]
    external_views = [
        {
            "name": "keyshift",
            "href": "keyshift/",  # relative to the UI's base URL, as Airflow asks of external views
            "url_route": "keyshift",
            "destination": "nav",
            "nav_top_level": True,  # its own entry in the navigation bar, not under Plugins
        }
    ]
