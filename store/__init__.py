"""Generic event store: append-only log, projections, leases with fencing, blobs. Knows no kernels."""

from store.errors import CorruptDatabase, ForeignDatabase, SchemaTooNew, StaleLease, StoreError
from store.projection import Projection
from store.records import Lease, NewEvent, StoredEvent
from store.sqlite import EventStore

__all__ = [
    "CorruptDatabase",
    "EventStore",
    "ForeignDatabase",
    "Lease",
    "NewEvent",
    "Projection",
    "SchemaTooNew",
    "StaleLease",
    "StoreError",
    "StoredEvent",
]
