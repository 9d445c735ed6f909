"""Errors the store raises for input a user can fix (shown as one line, exit code 2)."""


class TraceError(Exception):
    """A path is not a readable OpGuard trace (missing, not a trace, wrong schema)."""
