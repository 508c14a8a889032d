"""What a sandbox request can end in other than its reply: the candidate's fault, kb's own failure in the
child, or the problem's (the client, the gate and the reference's re-timing all raise them)."""

from __future__ import annotations

from kernelbrain.core.events import GateCategory


class SandboxFault(Exception):
    """The candidate's fault: its child died (crash, timeout) or it failed a check (mismatch, ...)."""

    def __init__(self, category: GateCategory, detail: str) -> None:
        super().__init__(f"{category}: {detail}")
        self.category = category
        self.detail = detail


class DeviceBusy(Exception):
    """The device ran out of memory while other processes held part of it: kb's fault (its pool's), not
    the candidate's or the problem's. The worker records it as the task's fault and tries it again."""


class SandboxError(Exception):
    """kb's own code failed inside the child (not the candidate's fault)."""


class ProblemFault(SandboxError):
    """The problem's own code raised in the judge, where no candidate code runs: the problem's fault."""
