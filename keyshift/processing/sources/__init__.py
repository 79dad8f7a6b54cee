"""The engine's input: a run's Kafka offsets and end-of-input markers, Spark's Kafka source and keyshift's aligned one."""
