"""keyshift: keyed streaming analytics on Spark Structured Streaming over Kafka, kept balanced.

The package is the one core library; the CLI (`keyshift.cli`) and the Airflow DAGs (`dags/`) are
thin front ends over it. Layout: `placement` (strategies, slot tokens), `monitoring`, `migration`,
`eventtime` (windows, watermarks), `processing` (records, stateful processor, sinks, the job),
`quality`, `stack` (local Kafka/Redis/Airflow/Spark), `data` (real inputs), `orchestration`.
"""

__version__ = "0.1.0"
