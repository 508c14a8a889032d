"""Every `kb` error path: one `Error: ...` line on stderr naming what to fix, a non-zero exit, no
traceback, and the database left as it was.

The error paths, command by command, and where each is tested:

| command | error path | test |
| --- | --- | --- |
| any | unknown command; missing argument; bad option value (range, choice, type) | USAGE below |
| run | missing, unreadable or malformed problem file | test_bad_input; CASES (not UTF-8) |
| run | problem path is a folder with no problem files | USAGE |
| run | database corrupt, from a newer kb, or foreign | test_bad_input |
| run | --db in a folder that is a file | CASES |
| run | unknown generator; llm without a model; llm endpoint dead | test_bad_input; test_llm_run |
| run | llm setting in the environment malformed (KB_LLM_TEMPERATURE=abc) | CASES |
| run | bad --ladder | test_pipeline |
| run | unknown class in --allow-torch | USAGE |
| run | --device cuda without a GPU; --inprocess with --external-workers | USAGE |
| run, resume | interrupted (exit 130, one line) | test_crash_loop |
| check | missing problem or candidate file; --device cuda without a GPU | CASES, USAGE |
| resume | unknown run; finished run; missing or unusable database | test_bad_input |
| worker | unknown role; --run of an unknown run; missing or unusable database | USAGE, CASES, BROKEN_DB |
| ls, status | missing or unusable database; unknown run | test_bad_input |
| events, replay, audit | unknown run; missing or unusable database | test_bad_input, BROKEN_DB |
| audit, export | unknown --candidate; a run with nothing measured yet | CASES |
| export | unknown run; output folder missing | test_bad_input |
| export | output path a directory; its folder a file (unwritable); bad --format | USAGE, CASES |
| doctor | bad --timeout-s (the rest are findings, all shown; a failed one exits 1) | USAGE; test_doctor |
| status, replay | a run with no RunStarted; one decided by a newer kb's policy | test_a_mistake_core_... |

A LookupError that a bug raises is not a user error: it keeps its traceback
(test_a_bugs_lookup_error_keeps_its_traceback).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from kernelbrain.store import EventStore

from kernelbrain.cli import main
from kernelbrain.core.events import GenerationDone, RunConfig, RunFinished
from kernelbrain.runtime.runner import DEFAULT_RUNGS, detect_device, start_run
from tests.test_bad_input import Snapshot, assert_user_error

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "softmax_run.db"
PROBLEM = ROOT / "tests" / "problems" / "softmax_small.py"
CANDIDATE = ROOT / "tests" / "candidates" / "good_softmax.py"
NO_GPU = pytest.mark.skipif(detect_device() == "cuda", reason="needs a machine without an NVIDIA GPU")


def kb(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("KB_DB", "KB_LLM_"))}
    full["PYTHONPATH"] = str(ROOT)
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "kernelbrain", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A copy of the recorded run, a run with nothing measured, and some awkward paths (every test
    asserts it leaves the database as it found it)."""
    tmp_path = tmp_path_factory.mktemp("errors")
    db = tmp_path / "kb.db"
    db.write_bytes(FIXTURE.read_bytes())
    with EventStore(db, create=False) as store:
        (run,) = store.run_ids()
        config = RunConfig(device="cpu", max_candidates=1, rungs=DEFAULT_RUNGS["cpu"])
        fresh = start_run(store, str(PROBLEM), config)  # started, never driven: nothing measured
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "latin1.py").write_bytes("# caf\xe9\nclass Model: pass\n".encode("latin-1"))
    return {
        "db": str(db),
        "run": run,
        "fresh": fresh,
        "problem": str(PROBLEM),
        "candidate": str(CANDIDATE),
        "dir": str(tmp_path / "a_dir"),
        "tmp": str(tmp_path),
    }


def fill(args: list[str], place: dict[str, str]) -> list[str]:
    return [a.format(**place) for a in args]


def in_process(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The same `kb` (click's standalone mode, KbGroup and all) without a process start: for the usage
    errors, which click raises before any command body runs."""
    try:
        runner = CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        runner = CliRunner()
    old = Path.cwd()
    os.chdir(cwd)
    try:
        r = runner.invoke(main, list(args), prog_name="kb", env=env or None)
    finally:
        os.chdir(old)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


def check(
    place: dict[str, str],
    args: list[str],
    names: list[str],
    code: int,
    env: dict[str, str],
    run=kb,
) -> None:
    snap = Snapshot(Path(place["db"]), kb_db=True)
    res = run(*fill(args, place), cwd=Path(place["tmp"]), **env)
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    assert res.stdout == "", res.stdout
    assert_user_error(res, *fill(names, place))
    snap.assert_unchanged()


# usage errors: exit 2, one line that ends by pointing at the command's help
USAGE = [
    ("no-command", ["no-such-command"], ["No such command 'no-such-command'", "kb --help"]),
    ("run-no-problem", ["run", "--db", "{db}"], ["Missing argument 'PROBLEMS...'", "kb run --help"]),
    ("run-problem-is-a-dir", ["run", "{dir}", "--db", "{db}"], ["{dir}", "no problem files (*.py)"]),
    (
        "run-max-candidates-0",
        ["run", "{problem}", "--db", "{db}", "--max-candidates", "0"],
        ["--max-candidates"],
    ),
    ("run-device-gpu", ["run", "{problem}", "--db", "{db}", "--device", "gpu"], ["--device", "'gpu'"]),
    ("run-eta-1", ["run", "{problem}", "--db", "{db}", "--eta", "1"], ["--eta"]),
    ("run-seed-text", ["run", "{problem}", "--db", "{db}", "--seed", "x"], ["--seed", "'x'"]),
    ("run-budget-negative", ["run", "{problem}", "--db", "{db}", "--budget-gpu-s", "-1"], ["--budget-gpu-s"]),
    ("run-budget-wall-0", ["run", "{problem}", "--db", "{db}", "--budget-wall-s", "0"], ["--budget-wall-s"]),
    ("run-tokens-0", ["run", "{problem}", "--db", "{db}", "--budget-tokens", "0"], ["--budget-tokens"]),
    ("run-gpu-negative", ["run", "{problem}", "--db", "{db}", "--gpu", "-1"], ["--gpu"]),
    (
        "run-allow-torch-bogus",
        ["run", "{problem}", "--db", "{db}", "--allow-torch", "conv,bogus"],
        ["--allow-torch", "'bogus' is not a class of torch ops", "conv, matmul, norm"],
    ),
    ("run-llm-timeout-0", ["run", "{problem}", "--db", "{db}", "--llm-timeout-s", "0"], ["--llm-timeout-s"]),
    (
        "run-inprocess-and-external",
        ["run", "{problem}", "--db", "{db}", "--inprocess", "--external-workers"],
        ["--inprocess", "--external-workers"],
    ),
    ("check-no-candidate", ["check", "{problem}"], ["Missing argument 'CANDIDATE'"]),
    ("resume-gpu-negative", ["resume", "{run}", "--db", "{db}", "--gpu", "-1"], ["--gpu"]),
    ("status-no-run", ["status", "--db", "{db}"], ["Missing argument 'RUN_ID'"]),
    ("worker-bad-role", ["worker", "nobody", "--db", "{db}"], ["'nobody'", "gatekeeper"]),
    ("export-no-output", ["export", "{run}", "--db", "{db}"], ["Missing option '-o'"]),
    (
        "export-output-is-a-dir",
        ["export", "{run}", "--db", "{db}", "-o", "{dir}"],
        ["{dir}", "is a directory"],
    ),
    (
        "export-bad-format",
        ["export", "{run}", "--db", "{db}", "-o", "k.py", "--format", "zip"],
        ["--format", "zip"],
    ),
    ("doctor-timeout-0", ["doctor", "--timeout-s", "0"], ["--timeout-s"]),
]


@pytest.mark.parametrize(("args", "names"), [c[1:] for c in USAGE], ids=[c[0] for c in USAGE])
def test_usage_errors(place: dict[str, str], args: list[str], names: list[str]) -> None:
    check(place, args, names, 2, {}, run=in_process)
    assert not (Path(place["tmp"]) / "k.py").exists()


def test_a_usage_error_from_the_real_command_is_one_line(place: dict[str, str]) -> None:
    check(place, ["run", "{problem}", "--db", "{db}", "--eta", "1"], ["--eta", "kb run --help"], 2, {})


@NO_GPU
@pytest.mark.parametrize(
    "args",
    [
        ["run", "{problem}", "--db", "{db}", "--device", "cuda"],
        ["check", "{problem}", "{candidate}", "--device", "cuda"],
    ],
    ids=["run", "check"],
)
def test_cuda_without_a_gpu_is_refused_before_anything_runs(place: dict[str, str], args: list[str]) -> None:
    check(place, args, ["--device", "no NVIDIA GPU", "--device cpu"], 2, {})


# user errors: exit 1
CASES = [
    (
        "run-problem-not-utf8",
        ["run", "{tmp}/latin1.py", "--db", "{db}"],
        ["{tmp}/latin1.py", "cannot be read"],
        {},
    ),
    (
        "run-db-folder-is-a-file",
        ["run", "{problem}", "--db", "{db}/kb.db"],
        ["{db}/kb.db", "cannot open"],
        {},
    ),
    (
        "run-llm-env-malformed",
        ["run", "{problem}", "--db", "{db}", "--generator", "llm", "--llm-model", "m"],
        ["KB_LLM_TEMPERATURE='abc'", "not a valid float"],
        {"KB_LLM_TEMPERATURE": "abc"},
    ),
    ("check-no-problem", ["check", "{tmp}/nope.py", "{candidate}"], ["{tmp}/nope.py", "does not exist"], {}),
    ("check-no-candidate-file", ["check", "{problem}", "{tmp}/nope.py"], ["{tmp}/nope.py", "ModelNew"], {}),
    (
        "worker-unknown-run",
        ["worker", "gatekeeper", "--db", "{db}", "--run", "r-nope"],
        ["'r-nope'", "kb ls"],
        {},
    ),
    ("worker-no-db", ["worker", "gatekeeper", "--db", "{tmp}/absent.db"], ["{tmp}/absent.db"], {}),
    ("status-db-is-a-dir", ["status", "{run}", "--db", "{dir}"], ["{dir}"], {}),
    (
        "audit-unknown-candidate",
        ["audit", "{run}", "--db", "{db}", "--candidate", "zzz"],
        ["'zzz'", "kb status"],
        {},
    ),
    (
        "export-unknown-candidate",
        ["export", "{run}", "--db", "{db}", "-o", "k.py", "--candidate", "zzz"],
        ["'zzz'"],
        {},
    ),
    (
        "export-unwritable",
        ["export", "{run}", "--db", "{db}", "-o", "{db}/k.py"],
        ["cannot write {db}/k.py", "writable folder"],
        {},
    ),
    (
        "export-nothing-measured",
        ["export", "{fresh}", "--db", "{db}", "-o", "k.py"],
        ["{fresh}", "no measured"],
        {},
    ),
    ("audit-nothing-measured", ["audit", "{fresh}", "--db", "{db}"], ["{fresh}", "no measured"], {}),
]


# the problem file's fault: exit 4 (EXIT_PROBLEM), not 1
PROBLEM_FAULTS = {"run-problem-not-utf8", "check-no-problem"}


@pytest.mark.parametrize(("case", "args", "names", "env"), CASES, ids=[c[0] for c in CASES])
def test_user_errors(
    place: dict[str, str], case: str, args: list[str], names: list[str], env: dict[str, str]
) -> None:
    check(place, args, names, 4 if case in PROBLEM_FAULTS else 1, env)
    assert not (Path(place["tmp"]) / "k.py").exists()


BROKEN_DB = [
    ["events", "r-x"],
    ["replay", "r-x"],
    ["audit", "r-x"],
    ["export", "r-x", "-o", "k.py"],
    ["worker", "gatekeeper", "--run", "r-x"],
]


@pytest.mark.parametrize("args", BROKEN_DB, ids=lambda a: a[0])
def test_a_corrupt_database_is_refused_untouched(tmp_path: Path, args: list[str]) -> None:
    db = tmp_path / "kb.db"
    db.write_bytes(os.urandom(8192))
    snap = Snapshot(db)
    assert_user_error(kb(*args, "--db", str(db), cwd=tmp_path), str(db), "not a readable kb database")
    snap.assert_unchanged()


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A database with a run that has no RunStarted, and one a newer kb decided (policy version 99)."""
    tmp_path = tmp_path_factory.mktemp("mistakes")
    db = tmp_path / "kb.db"
    with EventStore(db) as store:
        orphan = GenerationDone(task="round0", proposed=[], duplicates=0)
        store.append([orphan.to_new("r-unstarted", "r-unstarted/gen/round0/done", "cli")])
        config = RunConfig(device="cpu", max_candidates=1, rungs=DEFAULT_RUNGS["cpu"], policy_version=99)
        newer = start_run(store, str(PROBLEM), config)
        finished = RunFinished(basis=1, reason="r", winner=None, winner_rung=None, winner_score=None)
        store.append([finished.to_new(newer, f"{newer}/finished", "cli")])
    return {"db": str(db), "newer": newer, "tmp": str(tmp_path)}


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["status", "r-unstarted"], ["r-unstarted", "no RunStarted"]),
        (["replay", "{newer}"], ["no scheduler policy version 99", "upgrade"]),
    ],
    ids=["no-run-started", "unknown-policy"],
)
def test_a_mistake_core_raises_on_purpose_is_one_line(
    mistakes: dict[str, str], args: list[str], names: list[str]
) -> None:
    snap = Snapshot(Path(mistakes["db"]), kb_db=True)
    res = kb(*fill(args, mistakes), "--db", mistakes["db"], cwd=Path(mistakes["tmp"]))
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert_user_error(res, *fill(names, mistakes))
    snap.assert_unchanged()


# a bug planted in the view `kb ls` calls, then the real command line
PLANTED = (
    "import sys, kernelbrain.views.describe as d\n"
    "def bug(state): raise {error}('planted')\n"
    "d.status_dict = bug\n"
    "from kernelbrain.cli import main\n"
    "main(sys.argv[1:], prog_name='kb')\n"
)


@pytest.mark.parametrize("error", ["KeyError", "IndexError", "LookupError"])
def test_a_bugs_lookup_error_keeps_its_traceback(place: dict[str, str], error: str) -> None:
    """Only kb's own user-error types become one line: a LookupError from a bug is not taken for the
    user's mistake, and the traceback says where it came from."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_DB")} | {"PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-c", PLANTED.format(error=error), "ls", "--db", place["db"]],
        cwd=place["tmp"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert "Traceback" in res.stderr and "in bug" in res.stderr, res.stderr
    shown = "'planted'" if error == "KeyError" else "planted"  # KeyError's str() quotes its key
    assert res.stderr.strip().splitlines()[-1] == f"{error}: {shown}", res.stderr
    assert not res.stderr.startswith("Error: "), res.stderr
