"""The engine's operators: the functions and classes that run on Spark's executors, from Kafka bytes to a key's windows (ingest, Local Merge, the exchange, the stateful processors)."""
