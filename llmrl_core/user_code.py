"""The error of code a run's config names (a reward function, an env factory, an env transform): its message
names the setting or class and what went wrong, so the command line prints it in one line (the traceback stays in
the worker's log), and a retry would only fail the same way."""

from __future__ import annotations


class UserCodeError(ValueError):
    """Code the run's config names failed; the message says which and how (the cause is chained)."""
