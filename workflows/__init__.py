"""Deterministic workflow code and the contracts that cross the activity boundary, and beside them what both
workers share (artifacts.py, metrics.py, logs.py). The workflow modules import no torch, triton, openai or
structlog, nor the shared I/O modules: the workflow sandbox re-imports them for every run."""
