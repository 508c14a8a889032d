"""KernelBench's loader builds `Model(*get_init_inputs())`, seeds again, builds `ModelNew` the same way and
copies no weights: every round-0 candidate of a problem with parameters must then hold the reference's
state, under the same names, drawn by the same RNG use (issue 15, item 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelbrain.child.loading import Problem, load_module
from kernelbrain.core.events import ProblemAnalysed
from kernelbrain.core.protocol import AnalyseRequest
from kernelbrain.generators.expert import ExpertGenerator

ROOT = Path(__file__).resolve().parents[1]
# the seed and test problems whose reference holds parameters or buffers
WITH_STATE = [
    ROOT / "benchmarks" / "problems" / "linear_relu_div.py",
    ROOT / "benchmarks" / "problems" / "group_conv.py",
    ROOT / "tests" / "problems" / "layernorm_small.py",
]


@pytest.mark.parametrize("path", WITH_STATE, ids=[p.stem for p in WITH_STATE])
def test_every_candidate_builds_the_references_state_as_kernelbenchs_loader_does(box, path: Path) -> None:
    source = path.read_text()
    reply = box.call(AnalyseRequest(problem_source=source, device="cpu"), timeout_s=120)[0]
    analysis = ProblemAnalysed(**reply.model_dump(), families=[])
    proposals = ExpertGenerator().first_round(analysis, problem_source=source)
    assert proposals, f"no template proposes for {path.name}"
    problem = Problem(source)
    init = problem.init_inputs(problem.ladder_shapes("cpu", "smallest")[0])
    torch.manual_seed(42)
    want = problem.module.Model(*init).state_dict()
    assert want, f"{path.name}'s reference holds no state: it does not belong in this table"
    for p in proposals:
        module = load_module(p.source, "samestate")
        torch.manual_seed(42)
        got = module.ModelNew(*init).state_dict()
        assert list(got) == list(want), (p.strategy, list(got), list(want))
        for name, value in want.items():
            assert got[name].shape == value.shape and torch.equal(got[name], value), (p.strategy, name)
