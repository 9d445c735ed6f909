"""Errors the store raises for input a user can fix (shown as one line, exit code 2)."""


class TraceError(Exception):
    """A path is not a readable OpGuard trace (missing, not a trace, wrong schema)."""


class DamagedRecord(TraceError):
    """A stored record that does not have the form the recorder writes (a damaged trace)."""
