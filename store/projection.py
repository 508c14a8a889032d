"""Projection: state folded from the log, resumable from its position."""

from __future__ import annotations

import abc

from kernelbrain.store.records import StoredEvent


class Projection(abc.ABC):
    """Folded state. `position` is the seq of the last applied event (0 = nothing).

    Subclasses implement `apply`; `EventStore.fold` feeds it every event after `position`, in seq
    order, and advances `position`. Keep `apply` a pure function of the events so that replaying the
    same prefix always rebuilds the same state.
    """

    position: int = 0  # class default too, so a subclass that forgets super().__init__() still works

    def __init__(self) -> None:
        self.position = 0

    @abc.abstractmethod
    def apply(self, event: StoredEvent) -> None:
        """Fold one event into the state."""
