"""Deterministic workflow code and the contracts that cross the activity boundary. No torch, triton,
openai or structlog imports here: the workflow sandbox re-imports these modules for every run."""
