"""Metrics, traces and logs of the server and the workers (see docs/operations.md)."""
