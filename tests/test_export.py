"""`kb export` from a recorded run: the standalone module checks and times itself without kernelbrain, and
the kernelbench format is the custom-model file KernelBench's evaluator imports."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kernelbrain.store import EventStore

from kernelbrain.core.errors import RunError
from kernelbrain.core.events import CandidateProposed, GatePassed, ProblemAnalysed
from kernelbrain.core.protocol import AnalyseRequest
from kernelbrain.views.export import export_source, kernelbench_flags, string_literal
from tests.kbcli import kb
from tests.runs import SyntheticRun

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "softmax_run.db"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """(folder outside the repo, run id, winner) with kernel.py and kb_model.py exported from the fixture."""
    work = tmp_path_factory.mktemp("export")
    db = work / "kb.db"
    db.write_bytes(FIXTURE.read_bytes())
    with EventStore(db, create=False) as store:
        (run_id,) = store.run_ids()
    for name, fmt in (("kernel.py", "standalone"), ("kb_model.py", "kernelbench")):
        r = kb("export", run_id, "--db", str(db), "-o", str(work / name), "--format", fmt)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"wrote {work / name}"
        assert r.stderr == ""  # nothing in the softmax winner that KernelBench's static checker rejects
    # a kernelbrain and a store that fail on import, first on the path: the files must need neither
    for pkg in ("kernelbrain", "store"):
        (work / "blocked" / pkg).mkdir(parents=True)
        (work / "blocked" / pkg / "__init__.py").write_text(
            f"raise ImportError('{pkg} must not be imported')\n"
        )
    winner = re.search(r"# Candidate (\w+) ", (work / "kernel.py").read_text()).group(1)
    return work, run_id, winner


def python(work: Path, *args: str, interpret: bool = True) -> subprocess.CompletedProcess[str]:
    """Python in a clean environment: no repo on the path (and cwd outside it), kb's packages blocked."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = str(work / "blocked")
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    assert str(ROOT) not in env["PYTHONPATH"] and not str(work).startswith(str(ROOT))
    return subprocess.run(
        [sys.executable, *args], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )


def test_python_kernel_py_checks_and_times_against_the_reference(exported: tuple[Path, str, str]) -> None:
    work, run_id, winner = exported
    text = (work / "kernel.py").read_text()
    assert f"run {run_id}" in text and winner in text
    r = python(work, "kernel.py")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("PASS batch_size=8,dim=200: matches the reference on 3 seeds"), r.stdout
    assert "tolerance 0.0001" in lines[0]  # the problem's fp32 tolerance
    m = re.fullmatch(
        r"speedup ([0-9.e+-]+)x at batch_size=8,dim=200: ModelNew .+ vs reference .+ "
        r"\(median of 5, wall clock, Triton interpreter\)",
        lines[1],
    )
    assert m and float(m.group(1)) > 0, lines[1]


def test_a_wrong_kernel_fails_the_check(exported: tuple[Path, str, str], tmp_path: Path) -> None:
    """The same kernel against a reference it does not compute (log-softmax): FAIL, exit 1, no timing."""
    work, _, _ = exported
    text = (work / "kernel.py").read_text()
    assert text.count("torch.softmax(x, dim=1)") == 1
    (work / "wrong.py").write_text(text.replace("torch.softmax(x, dim=1)", "torch.log_softmax(x, dim=1)"))
    r = python(work, "wrong.py", "--seeds", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.startswith("FAIL batch_size=8,dim=200: seed 0: output 0 differs at ")
    assert "speedup" not in r.stdout


def test_without_a_gpu_or_the_interpreter_it_says_what_to_do(exported: tuple[Path, str, str]) -> None:
    work, _, _ = exported
    r = python(work, "kernel.py", "--device", "cpu", interpret=False)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "error: no GPU; run `TRITON_INTERPRET=1 python kernel.py` to check the kernels on the CPU "
        "through the Triton interpreter"
    ]


def test_the_kernelbench_file_is_modelnew_and_its_imports(exported: tuple[Path, str, str]) -> None:
    work, _, winner = exported
    text = (work / "kb_model.py").read_text()
    tree = ast.parse(text)
    top = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    assert "ModelNew" in top
    assert not top & {"Model", "get_inputs", "get_init_inputs"}  # the reference comes separately
    assert "_KB_" not in text and "__main__" not in text and winner in text
    assert "ScalingIntelligence/KernelBench" in text  # the header says whose format it is
    # load it as KernelBench's load_custom_model_with_tempfile does, and build it the way its eval does
    check = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("temp_module", "kb_model.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
assert not any(m.split(".")[0] in ("kernelbrain", "store") for m in sys.modules)
model = module.ModelNew(*[])
x = torch.rand(8, 200)
torch.testing.assert_close(model(x), torch.softmax(x, dim=1), atol=1e-4, rtol=1e-4)
print("ok")
"""
    r = python(work, "-c", check)
    assert r.stdout.strip() == "ok", r.stderr


@pytest.mark.parametrize(
    "text",
    ["plain = 1\n", 'doc = """x"""\n', "a = '''x'''\nb = \"\"\"y\"\"\"\n", "ends = 1  # \\\n", "s = '\\n'\n"],
    ids=["plain", "triple-double", "both-triples", "backslash", "escape"],
)
def test_the_reference_is_embedded_exactly(text: str) -> None:
    assert ast.literal_eval(string_literal(text)) == text


def test_a_candidate_that_imports_kernelbrain_is_refused(tmp_path: Path) -> None:
    with EventStore(tmp_path / "kb.db", create=True) as store:
        run = SyntheticRun(store)
        source = "import torch\nfrom kernelbrain.templates import row_softmax\n\nclass ModelNew: ...\n"
        run.add(
            CandidateProposed(
                candidate="c1",
                source=store.put_blob(source),
                parent=None,
                generator="test",
                family="row_softmax",
                strategy="s",
                knobs={},
                round=0,
                hint="h",
            ),
            "propose/c1",
        )
        run.gate("c1")
        run.bench("c1", 0, 1.5)
        with pytest.raises(RunError, match=r"candidate c1 imports kernelbrain.templates \(line 2\)"):
            export_source(store, run.state())


def test_a_cpu_fitted_export_says_how_its_format_is_checked_at_the_files_sizes(tmp_path: Path) -> None:
    """Only the standalone file has a harness: the kernelbench file's header sends the user to `kb check`
    or KernelBench's evaluator, never to `python kernel.py --device cuda`, which does nothing for it."""
    own, fitted = "batch_size=4096,dim=393216", "batch_size=8,dim=1000"
    with EventStore(tmp_path / "kb.db", create=True) as store:
        run = SyntheticRun(store)  # a CPU run
        analysed = ProblemAnalysed(
            ops=[{"op": "softmax"}], families=["row_softmax"], flops=1, bytes=1, shapes=[own]
        )
        run.add(analysed.model_copy(update={"rung_shapes": [fitted]}), "analysis/fitted")
        run.propose("c1")
        passed = GatePassed(candidate="c1", seeds=3, max_abs_err=0, max_rel_err=0, tolerance=1e-4)
        run.add(passed.model_copy(update={"shapes": [fitted]}), "gate/c1")
        run.bench("c1", 0, 1.5)
        state = run.state()
        standalone = export_source(store, state)
        kernelbench = export_source(store, state, fmt="kernelbench")
    fitted_line = f"# Those are sizes fitted for the CPU from the file's own ({own}): check it at those on\n"
    assert fitted_line + "# a GPU (`python kernel.py --device cuda`) before relying on it.\n" in standalone
    check = "`kb check PROBLEM.py <this file> --device cuda --bench`\n# (or KernelBench's evaluator).\n"
    assert f"{fitted_line}# a GPU before relying on it: {check}" in kernelbench
    assert "python kernel.py" not in kernelbench
    assert "It has no harness" in kernelbench and "`kb check PROBLEM.py <this file> --bench`" in kernelbench


def test_what_kernelbenchs_static_checker_would_reject_is_named() -> None:
    """Its bypass check reads the text with '#' comments removed, docstrings kept (a GEMV template's
    docstring once said 'second-pass sum')."""
    assert kernelbench_flags('"""Split over K with a deterministic second-pass sum."""\n') == [
        "the word 'pass' (line 1)"
    ]
    assert kernelbench_flags("try:\n    x = 1\nexcept ValueError:\n    x = 2\n") == [
        "try/except (line 1)",
        "try/except (line 3)",
    ]
    assert kernelbench_flags("single_pass = 1  # pass, try: except\nbypassed = 2\n") == []


@pytest.mark.parametrize(
    "problem",
    sorted((ROOT / "benchmarks" / "problems").glob("*.py"))
    + sorted((ROOT / "tests" / "problems").glob("*.py")),
    ids=lambda p: f"{p.parent.parent.name}-{p.stem}",
)
def test_every_round0_render_passes_kernelbenchs_static_check(box, problem: Path) -> None:
    """`kb export --format kernelbench` warns about what KernelBench would reject: no template's
    rendered text (docstrings included) should give it cause, at any round-0 knob set of the family the
    problem matches (feasible at the smoke shape or not: the GPU's shapes differ)."""
    from kernelbrain.core.events import ProblemAnalysed
    from kernelbrain.generators.base import GenerationError
    from kernelbrain.generators.expert import ExpertGenerator

    source = problem.read_text()
    analysis = box.call(AnalyseRequest(problem_source=source, device="cpu"), timeout_s=120)[0].model_dump()
    analysed = ProblemAnalysed(**analysis, families=[])
    try:
        family, spec = ExpertGenerator().match_family(analysed, problem_source=source)
    except GenerationError:
        pytest.skip(f"{problem.name}: no template family matches (a problem for the LLM generator)")
    for knobs in family.ROUND0:
        text = family.render(spec, knobs, analysis["signature"])
        assert kernelbench_flags(text) == [], (family.FAMILY, knobs, kernelbench_flags(text))
