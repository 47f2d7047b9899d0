"""Observability shared by every role: Prometheus metrics, the `/metrics` endpoints, structured logs.

A leaf layer beside `contracts` (it imports contracts only): the gateway, the worker and the composition
root export through it; kernel, control and backends expose plain counters that these modules read.
See docs/observability.md.
"""
