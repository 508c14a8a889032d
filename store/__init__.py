"""Generic event store: append-only log, projections, leases with fencing, blobs. Knows no kernels.

Two adapters behind one contract (base.Store): EventStore on a SQLite file, the default, and
postgres.PostgresStore on a PostgreSQL server; open_store picks one from a --db path or URL."""

from kernelbrain.store.base import Store
from kernelbrain.store.errors import (
    BlobMissing,
    CorruptDatabase,
    ForeignDatabase,
    SchemaTooNew,
    StaleLease,
    StoreError,
    StoreUnavailable,
)
from kernelbrain.store.location import open_store
from kernelbrain.store.projection import Projection
from kernelbrain.store.records import Lease, NewEvent, StoredEvent
from kernelbrain.store.sqlite import EventStore
from kernelbrain.store.urls import mask

__all__ = [
    "BlobMissing",
    "CorruptDatabase",
    "EventStore",
    "ForeignDatabase",
    "Lease",
    "NewEvent",
    "Projection",
    "SchemaTooNew",
    "StaleLease",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "StoredEvent",
    "mask",
    "open_store",
]
