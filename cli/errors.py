"""The CLI's one kind of refusal."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input: printed as one line, exit status 2."""
