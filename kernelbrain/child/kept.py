"""The judge's check of a bench's kept timed calls: their outputs, handed over as raw bytes in the
outbox (kernelbrain/child/tensorfile.py: nothing unpickled), against the reference's on the same contents,
rebuilt here from the bench's seeded draws. The comparison runs in a process no candidate code ever ran
in: a candidate that patches what the comparison uses (a Tensor method, the screen's code) in its own
process changes nothing here."""

from __future__ import annotations

import torch

from kernelbrain.child import tensorfile
from kernelbrain.child.loading import CandidateFault, Problem, build
from kernelbrain.child.screen import CHANGED, expected_outputs, screen
from kernelbrain.child.timing import Rotation
from kernelbrain.core import handoff
from kernelbrain.core.protocol import KeptReply, KeptRequest


def check(request: KeptRequest) -> KeptReply:
    """Each kept call's outputs against the reference's, shape by shape; a CandidateFault (`mismatch`,
    "timed call N") at the first that differs, as the bench's own check said it."""
    problem = Problem(request.problem_source)
    shapes = problem.ladder_shapes(request.device, request.which)
    checked = 0
    with torch.no_grad():
        for index, shape in enumerate(shapes):
            calls = [k for k in request.kept if k.shape == index]
            if not calls:
                continue
            ref, _ = build(problem, None, shape, request.device)
            inputs = Rotation(problem, shape, request.device, request.seed)  # the bench's: the same draws
            for k in calls:
                path = handoff.kept_file(request.folder, index, k.call, k.side)
                when = f"{', candidate ' + k.side if k.side else ''}, timed call {k.call}"
                try:
                    got = tensorfile.read(path, request.device)
                except tensorfile.Unreadable as e:
                    raise CandidateFault(
                        "runtime", f"its timed call {k.call}'s outputs do not read: {e}"
                    ) from None
                expected = expected_outputs(problem, ref, inputs.inputs(k.draw, (k.offset, k.stride)))
                screen(problem, shape, got, expected, when=when, hint=CHANGED)
                checked += 1
    return KeptReply(checked=checked)
