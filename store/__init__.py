"""Generic event store: append-only log, projections, leases with fencing, blobs. Knows no kernels."""

from kernelbrain.store.errors import CorruptDatabase, ForeignDatabase, SchemaTooNew, StaleLease, StoreError
from kernelbrain.store.projection import Projection
from kernelbrain.store.records import Lease, NewEvent, StoredEvent
from kernelbrain.store.sqlite import EventStore

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
