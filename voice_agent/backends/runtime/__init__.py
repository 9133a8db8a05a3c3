"""Shared runtime pieces of the backends: batching, inference threads' options,
HTTP pools, packaged weights, duration summaries."""
