"""The module as constructed (issue 37): the reference runs in the mode Model(*get_init_inputs()) leaves it
in, training for a KernelBench file, unless `kb run --eval` asks for eval mode. A batch norm in training
mode normalises by the batch's statistics and updates its running ones, and the gate compares those
after each call like outputs; a reference that draws random numbers in training mode (dropout) is refused
with the --eval hint; the reference's own running statistics are never taken for a candidate's tampering."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kernelbrain.store import EventStore

from kernelbrain.child.analysis import analyse
from kernelbrain.child.loading import Problem, build, load_module
from kernelbrain.core.graph import Graph
from kernelbrain.core.problem import EVAL_LINE, in_eval_mode
from kernelbrain.core.protocol import GateRequest
from kernelbrain.templates.families import moments
from tests.kbcli import kb, kb_env
from tests.runs import QUICK_RUNGS, interpreter_env, run_inprocess, run_interpreted

BATCH_NORM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels, momentum=MOMENTUM)

    def forward(self, x):
        return self.bn(x)

batch_size = 4
channels = 6
height = 5
width = 7

def get_inputs():
    return [torch.randn(batch_size, channels, height, width) * 3 + 1]

def get_init_inputs():
    return [channels]
"""

DROPOUT = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return torch.relu(self.drop(x * 2.0))

batch_size = 8
dim = 64

def get_inputs():
    return [torch.randn(batch_size, dim)]

def get_init_inputs():
    return [0.25]
"""


def _norm(momentum: float, eval_mode: bool = False) -> str:
    source = BATCH_NORM.replace("MOMENTUM", str(momentum))
    return in_eval_mode(source) if eval_mode else source


def _rendered(source: str) -> tuple[dict, str]:
    """The analysis of a problem and the moments family's first round-0 candidate for it."""
    analysis = analyse(source, "cpu")
    spec = moments.refine(moments.matches(analysis["ops"], Graph.model_validate(analysis["graph"])), source)
    assert spec is not None
    return analysis, moments.render(spec, moments.ROUND0[0], analysis["signature"])


def test_the_reference_runs_as_constructed_and_in_eval_mode_where_asked() -> None:
    analysis = analyse(_norm(0.1), "cpu")
    assert analysis["mode"] == "training"
    spec = moments.matches(analysis["ops"], Graph.model_validate(analysis["graph"]))
    assert spec is not None and spec["mode"] == "batch" and spec["running"], spec
    analysis = analyse(_norm(0.1, eval_mode=True), "cpu")
    assert analysis["mode"] == "eval"
    spec = moments.matches(analysis["ops"], Graph.model_validate(analysis["graph"]))
    assert spec is not None and spec["mode"] == "running", spec
    assert in_eval_mode(in_eval_mode(BATCH_NORM)).count(EVAL_LINE) == 1


def test_the_gate_compares_the_running_statistics_a_training_call_updates(box) -> None:
    """The same batch statistics, so the same outputs, but a momentum of 0.3 where the reference's is 0.1:
    only the running statistics tell them apart. An eval-mode kernel for the training-mode reference
    computes a different model."""
    problem = _norm(0.1)
    _, right = _rendered(problem)
    _, other_momentum = _rendered(_norm(0.3))
    _, eval_kernel = _rendered(_norm(0.1, eval_mode=True))

    def gate(cand: str, source: str = problem):
        request = GateRequest(problem_source=source, cand_source=cand, device="cpu", seeds=3)
        return box.call(request, timeout_s=120)[0]

    reply = gate(right)
    assert reply.passed, reply
    reply = gate(other_momentum)
    assert not reply.passed and reply.category == "mismatch", reply
    assert "running state bn.running_mean (updated in training mode)" in reply.detail, reply.detail
    reply = gate(eval_kernel)
    assert not reply.passed and reply.category == "mismatch" and "output 0" in reply.detail, reply
    # in eval mode the eval kernel is right, the training one is not
    assert gate(eval_kernel, _norm(0.1, eval_mode=True)).passed
    assert not gate(right, _norm(0.1, eval_mode=True)).passed


def test_a_training_batch_norm_run_times_its_winner_and_never_blames_it_for_the_running_statistics(
    tmp_path,
) -> None:
    """The rungs run the reference beside the candidate: the statistics the reference's own calls update
    are not weights a candidate changed."""
    problem = tmp_path / "batch_norm.py"
    problem.write_text(_norm(0.1))
    state = run_inprocess(problem, tmp_path / "kb.db", max_candidates=2, rungs=QUICK_RUNGS)
    assert state.analysis is not None and state.analysis.mode == "training"
    faults = [c.gate.detail for c in state.candidates.values() if getattr(c.gate, "detail", None)]
    assert not any("weights" in f for f in faults), faults
    assert state.finished is not None and state.finished.winner, (state.finished, faults)
    # the exported file checks the running statistics too: against a reference of another momentum
    # (the same outputs), its check fails there
    kernel = tmp_path / "kernel.py"
    r = kb("export", state.run_id, "--db", str(tmp_path / "kb.db"), "-o", str(kernel), env=kb_env())
    assert r.returncode == 0, r.stderr
    text = kernel.read_text()
    kernel_part, reference_part = text.split('_KB_REFERENCE_SOURCE = r"""')
    assert reference_part.count("momentum=0.1") == 1
    other = (
        kernel_part + '_KB_REFERENCE_SOURCE = r"""' + reference_part.replace("momentum=0.1", "momentum=0.3")
    )
    (tmp_path / "other.py").write_text(other)
    for name, code in (("kernel.py", 0), ("other.py", 1)):
        r = subprocess.run(
            [sys.executable, name, "--seeds", "2", "--repeats", "1", "--warmup", "0"],
            cwd=tmp_path,
            env=interpreter_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == code, (name, r.stdout, r.stderr)
    assert "seed 0: running state bn.running_mean (updated in training mode) differs" in r.stdout, r.stdout


def test_dropout_in_training_mode_is_refused_and_runs_with_eval(tmp_path) -> None:
    problem = tmp_path / "dropout.py"
    problem.write_text(DROPOUT)
    db = tmp_path / "kb.db"
    args = ["--db", str(db), "--device", "cpu", "--max-candidates", "1", "--inprocess", "--quiet"]
    r = kb("run", str(problem), *args, env=kb_env())
    assert r.returncode == 4, (r.stdout, r.stderr)
    last = r.stdout.strip().splitlines()[-1]
    assert f"the problem file {problem} draws random numbers in training mode" in last, last
    assert "aten.bernoulli_.float" in last and "`kb run --eval`" in last and "(exit 4)" in last, last
    r = kb("run", str(problem), *args, "--eval", "--ladder", "smallest:2:1", env=kb_env())
    assert r.returncode == 0, (r.stdout, r.stderr)
    run_id = r.stdout.split()[1]
    with EventStore(db, create=False) as store:
        started = next(e for e in store.read(run_id=run_id) if e.type == "RunStarted")
        source = store.get_blob(started.payload["problem_hash"]).decode()
        analysed = next(e for e in store.read(run_id=run_id) if e.type == "ProblemAnalysed")
    assert source == in_eval_mode(DROPOUT) and Path(problem).read_text() == DROPOUT
    assert started.payload["config"]["eval_mode"] is True and analysed.payload["mode"] == "eval"


OWN_IMPORTS = """
import json, sys, torch
from kernelbrain.child import guard
from kernelbrain.child.loading import Problem

problem = Problem(sys.argv[1])
guard.install()
assert "torch._dynamo" not in sys.modules
if sys.argv[2] == "tampered":
    torch.manual_seed = lambda seed: None  # what a candidate might do before kb sizes the inputs
problem.inputs({}, 0, "meta")  # its arithmetic on meta imports torch._dynamo
try:
    guard.check_untouched(None, {})
    said = None
except guard.Violation as v:
    said = str(v)
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules, "said": said}))
"""


def test_what_torch_replaces_importing_dynamo_under_kbs_own_call_is_not_the_candidates() -> None:
    """On CPU, sizing get_inputs on the meta device imports torch._dynamo, which replaces torch.manual_seed:
    torch's doing under kb's own call, not the candidate's. A seed function the candidate had replaced
    before is still named."""
    source = _norm(0.1)
    clean = run_interpreted(OWN_IMPORTS, source, "clean")
    assert clean == {"dynamo": True, "said": None}, clean
    tampered = run_interpreted(OWN_IMPORTS, source, "tampered")
    assert tampered["dynamo"] and "the candidate replaced torch.manual_seed" in tampered["said"], tampered


def test_a_constructor_that_chooses_eval_is_matched_in_eval(box) -> None:
    """Model's own self.eval() in __init__: the reference runs in eval, and so is every candidate built."""
    built = "        self.bn = nn.BatchNorm2d(channels, momentum=0.1)\n"
    source = _norm(0.1).replace(built, built + "        self.eval()\n")
    assert "self.eval()" in source
    analysis, kernel = _rendered(source)
    assert analysis["mode"] == "eval"
    # a ModelNew whose own constructor leaves it in training is built in the reference's mode
    plain = "import torch.nn as nn\nclass ModelNew(nn.Module):\n    def __init__(self, channels):\n"
    plain += "        super().__init__()\n        self.bn = nn.BatchNorm2d(channels)\n"
    problem = Problem(source)
    ref, new = build(problem, load_module(plain, "cand"), problem.shapes[0], "cpu")
    assert not ref.training and new is not None and not new.training
    request = GateRequest(problem_source=source, cand_source=kernel, device="cpu", seeds=3)
    reply = box.call(request, timeout_s=120)[0]
    assert reply.passed, reply


def test_the_batch_counter_is_compared_only_where_it_weighs_the_average() -> None:
    import torch

    from kernelbrain.child.loading import running_state

    with_momentum, cumulative = torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3, momentum=None)
    assert running_state(with_momentum) == {"running_mean", "running_var", "num_batches_tracked"}
    assert running_state(with_momentum, compared=True) == {"running_mean", "running_var"}
    assert "num_batches_tracked" in running_state(cumulative, compared=True)
    assert running_state(with_momentum.eval()) == set()  # eval mode updates nothing


def test_a_run_analysed_before_modules_ran_as_built_stays_in_eval_mode() -> None:
    """Its verdicts were all made in eval mode: resumed, its children see the problem in eval mode."""
    from kernelbrain.core.state import RunState

    fixture = Path(__file__).resolve().parent / "fixtures" / "softmax_run.db"
    with EventStore(fixture, create=False, readonly=True) as store:
        (run_id,) = store.run_ids()
        state = store.fold(RunState(run_id), run_id=run_id)
    assert state.analysis is not None and state.analysis.mode is None and not state.config.eval_mode
    assert state.eval_mode


def test_a_draw_made_even_in_eval_mode_is_refused_without_the_eval_hint() -> None:
    """F.dropout's training=True by default: random in eval mode too, so --eval is no way out."""
    from kernelbrain.core.protocol import AnalyseReply
    from kernelbrain.runtime.roles.generator import GeneratorRole, stochastic

    always = in_eval_mode(DROPOUT.replace("self.drop(x * 2.0)", "torch.nn.functional.dropout(x * 2.0, 0.25)"))
    said = stochastic(GeneratorRole.analysed(AnalyseReply.model_validate(analyse(always, "cpu"))))
    assert said is not None and said.startswith("draws random numbers even in eval mode"), said
    assert "--eval" not in said and "self.training" in said
    assert (
        stochastic(GeneratorRole.analysed(AnalyseReply.model_validate(analyse(in_eval_mode(DROPOUT), "cpu"))))
        is None
    )


def test_kb_check_eval_gates_a_kernel_against_the_reference_in_eval_mode(tmp_path) -> None:
    """`kb check --eval` holds a file to the problem as `kb run --eval` records it: an eval-mode batch norm
    kernel fails against the training-mode reference the file builds, and passes with --eval."""
    problem, kernel = tmp_path / "batch_norm.py", tmp_path / "kernel.py"
    problem.write_text(_norm(0.1))
    kernel.write_text(_rendered(_norm(0.1, eval_mode=True))[1])
    r = kb("check", str(problem), str(kernel), "--device", "cpu", env=kb_env())
    assert r.returncode == 1 and r.stdout.startswith("FAILED [mismatch]"), (r.stdout, r.stderr)
    r = kb("check", str(problem), str(kernel), "--device", "cpu", "--eval", env=kb_env())
    assert r.returncode == 0 and r.stdout.startswith("PASSED"), (r.stdout, r.stderr)
    assert problem.read_text() == _norm(0.1)
