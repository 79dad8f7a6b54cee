"""Benchmarks of keyshift's parts on real and synthetic inputs, each writing a JSON report.

`placement`: every placement strategy's per-slot balance on the flights and on Zipf keys, plus
the producer partitioner's throughput against kafka-python's default (`keyshift bench placement`).
"""
