"""The store's exceptions. Each str() is one line that says what is wrong and what to do."""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error the store raises (sqlite3 errors are translated into these)."""


class CorruptDatabase(StoreError):
    """The file exists but SQLite cannot read it as a database (or it is damaged)."""


class SchemaTooNew(StoreError):
    """The database was migrated by a newer kb than this one; opening it would risk misreading it."""


class ForeignDatabase(StoreError):
    """A valid SQLite database that some other program owns; we refuse to add our tables to it."""


class StaleLease(StoreError):
    """A result or renewal under a lease whose token is no longer current, or for a done task."""


class StoreUnavailable(StoreError):
    """The database could not be reached (its server down or restarting, the network cut, no connection
    free in time): nothing is wrong with the request, and it is worth trying again later."""


class BlobMissing(StoreError, KeyError):
    """No blob under that hash: the database lacks a blob its events name. A KeyError too, for callers
    that look a name up to see whether it names anything."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no such blob"  # KeyError's own str() quotes it
