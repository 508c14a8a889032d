"""The user's mistakes kb raises on purpose, as types of its own, kept below every layer that raises
them so that none imports another only for an exception class.

The CLI turns a `UserError` into one line and exit 1 (kernelbrain/commands/options.py). A builtin
`LookupError` or `KeyError` is never caught there, so a bug that raises one keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user asked for cannot be done as asked; the message says why and what to do."""


class RunError(UserError):
    """A run cannot be started, resumed, shown or copied; the message says why and what to do."""


class RunNotStarted(UserError):
    """A run's log has events but no RunStarted: nothing about the run can be said without its config."""


class UnknownPolicy(UserError):
    """The run was decided by a scheduler policy this kb does not have (a newer kb wrote it)."""
