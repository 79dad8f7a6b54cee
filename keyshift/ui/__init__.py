"""The keyshift page in the Airflow UI: what keyshift knows about its topics and runs.

An Airflow 3.1+ plugin (`plugins/keyshift_ui.py`) mounts this package's FastAPI app under
`/keyshift` on the api-server and puts it in the UI's navigation as an external view. The page
reads only keyshift's own records (Redis and `runs/<run_id>/`), never Spark's UI:

| module | does |
| --- | --- |
| `data` | pure functions: a run's files and stored records -> frozen values (batch loads, task seconds, switches, quality, monitor series) |
| `store` | reads Redis and the run folders and assembles the topic and run views from `data` |
| `plots` | server-side SVG charts (matplotlib, Agg): per-slot load, task seconds, balance degree of every strategy, consumer lag |
| `pages` | the HTML of the overview, topic and run pages |
| `auth` | the login check: the api-server's JWT (`_token` cookie or `Authorization: Bearer`) through Airflow's auth manager |
| `app` | the FastAPI app and its routes |
| `asgi` | `LazyApp`, the object the plugin mounts: builds the app on the first request, so importing the plugin does nothing |
"""
