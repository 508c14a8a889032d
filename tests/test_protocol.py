"""The sandbox protocol's models: each request knows its reply type from its type parameter, a reply is
validated as that type, and the analysis's reply becomes the run's ProblemAnalysed field for field (the
generator role's mapping)."""

from __future__ import annotations

import typing

import pytest
from pydantic import ValidationError

from kernelbrain.core import protocol
from kernelbrain.core.events import ProblemAnalysed
from kernelbrain.core.graph import Graph
from kernelbrain.core.protocol import (
    AnalyseReply,
    BenchReply,
    DuelReply,
    DuelRequest,
    Fit,
    GateReply,
    GateRequest,
    JudgeRequest,
    Request,
    Signature,
)
from kernelbrain.runtime.roles import GeneratorRole

REQUESTS = [
    c
    for c in vars(protocol).values()
    if isinstance(c, type) and issubclass(c, Request) and c.__name__.endswith("Request") and c is not Request
]


def test_every_request_replies_with_the_type_it_is_parametrised_by() -> None:
    assert len(REQUESTS) == 12
    for request in REQUESTS:
        (parametrised,) = [
            b
            for b in request.__mro__
            if getattr(b, "__pydantic_generic_metadata__", {}).get("origin") is Request
        ]
        assert request.reply is parametrised.__pydantic_generic_metadata__["args"][0], request
    assert GateRequest.reply is JudgeRequest.reply is GateReply


def test_the_child_serves_every_request_but_the_gate() -> None:
    """The gate runs across two children on the host (runtime/gate.py); the child's ops are the rest."""
    served = {a for a in typing.get_args(typing.get_args(protocol.AnyRequest)[0])}
    assert served == set(REQUESTS) - {GateRequest}


def test_a_reply_is_validated_as_its_requests_type() -> None:
    duel = DuelRequest(
        problem_source="p", device="cpu", a_source="a", b_source="b", which="smallest", repeats=2, warmup=1
    )
    reply = duel.parse_reply({"ratios": [1.0, 0.5], "timer": "interpreter-wallclock"})
    assert isinstance(reply, DuelReply) and reply.ratios == [1.0, 0.5]
    assert duel.parse_reply(reply) is reply  # a reply already of the type passes as it is
    with pytest.raises(ValidationError):
        duel.parse_reply(BenchReply(shapes=[], timer="t"))  # another op's reply
    with pytest.raises(ValidationError):
        duel.parse_reply({"ratios": "fast", "timer": "t"})


def test_the_analysis_reply_becomes_problem_analysed_field_for_field() -> None:
    reply = AnalyseReply(
        ops=[{"op": "aten::softmax"}],
        flops=10.0,
        bytes=20.0,
        shapes=["n=4"],
        signature=Signature(init=["dim"], forward=["x"], params=["dim=1"]),
        traced_on="meta",
        rung_shapes=["n=2"],
        primary_ops=[{"op": "aten::exp"}],
        fits=[Fit(shape="n=4", budget=1 << 20, rows=8, sizes={"n": 2})],
        graph=Graph(nodes=[], outputs=[[0, 0]]),
    )
    analysed = GeneratorRole.analysed(reply)
    assert set(AnalyseReply.model_fields) <= set(ProblemAnalysed.model_fields)
    assert analysed.families == []
    # every field of the reply is carried, none left at its default
    assert {k: v for k, v in analysed.model_dump().items() if k != "families"} == reply.model_dump() | {
        "error": None
    }
