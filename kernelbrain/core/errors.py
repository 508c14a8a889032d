"""Errors more than one layer raises: kept here, below them all, so that none imports another only
for an exception class."""

from __future__ import annotations


class RunError(Exception):
    """A run cannot be started, resumed, shown or copied; the message says why and what to do."""
