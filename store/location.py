"""Where a store lives, from a --db value: a SQLite file path (the default) or a postgresql:// URL.

`open_store` is the one place kb turns a --db value (or KB_DB) into a store; `urls` says which of the
two a value is, and what may be printed of it.
"""

from __future__ import annotations

import os
from typing import Any

from kernelbrain.store.base import Store
from kernelbrain.store.urls import is_url


def open_store(
    db: str | os.PathLike[str], *, create: bool = True, readonly: bool = False, **kw: Any
) -> Store:
    """The store at `db`: PostgresStore for a postgresql:// URL, EventStore (SQLite) for a path.

    create=False refuses a SQLite file that does not exist (a PostgreSQL database must exist anyway);
    readonly=True never writes. Other keywords go to the adapter."""
    if is_url(db):
        from kernelbrain.store.postgres import PostgresStore  # psycopg is imported only when used

        return PostgresStore(os.fspath(db), readonly=readonly, **kw)
    from kernelbrain.store.sqlite import EventStore

    return EventStore(db, create=create, readonly=readonly, **kw)
