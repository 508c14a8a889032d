"""Bad input through the real `kb` CLI: one clear line on stderr, a non-zero exit, no traceback, and an
existing database left exactly as it was."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kernelbrain.store import EventStore

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "tests" / "problems" / "softmax_small.py"


def kb(*args: str | Path, cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KB_DB"}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-m", "kernelbrain", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_user_error(res: subprocess.CompletedProcess[str], *names: str) -> str:
    """Exit != 0, stderr exactly one non-empty 'Error: ...' line naming each of names, no traceback."""
    assert res.returncode != 0, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr + res.stdout, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), res.stderr
    line = lines[0]
    assert line.startswith("Error: "), line
    for name in names:
        assert name in line, f"{name!r} not in {line!r}"
    return line


class Snapshot:
    """A database file's bytes, its directory's listing and, for a kb database, its event count."""

    def __init__(self, db: Path, *, kb_db: bool = False) -> None:
        self.db = db
        self.data = db.read_bytes()
        self.listing = sorted(os.listdir(db.parent))
        self.count = self._count() if kb_db else None

    def _count(self) -> int:
        # immutable=1: a read that takes no lock and leaves no -wal/-shm file behind
        conn = sqlite3.connect(f"{self.db.as_uri()}?immutable=1", uri=True)
        try:
            return conn.execute("SELECT count(*) FROM events").fetchone()[0]
        finally:
            conn.close()

    def assert_unchanged(self) -> None:
        assert self.db.read_bytes() == self.data, f"{self.db} was modified"
        assert sorted(os.listdir(self.db.parent)) == self.listing
        if self.count is not None:
            assert self._count() == self.count


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A real run, finished: (db, run id). One per module: it takes about ten seconds."""
    d = tmp_path_factory.mktemp("finished")
    db = d / "kb.db"
    res = kb("run", PROBLEM, "--db", db, "--inprocess", "--max-candidates", "1", "--quiet", cwd=d)
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.splitlines()[0].removeprefix("run ").strip()
    assert "finished" in res.stdout
    with EventStore(db, create=False) as store:
        assert run_id in store.run_ids()
        assert store.count(run_id=run_id, type="RunFinished") == 1
    return db, run_id


@pytest.fixture
def kb_db(finished_run: tuple[Path, str], tmp_path: Path) -> tuple[Path, str]:
    """A private copy of the finished run's database (the module's one stays pristine)."""
    db, run_id = finished_run
    copy = tmp_path / "kb.db"
    with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    src.close()
    dst.close()
    return copy, run_id


# --- problem files -------------------------------------------------------------------------------------


def test_a_missing_problem_file_leaves_an_existing_database_alone(
    kb_db: tuple[Path, str], tmp_path: Path
) -> None:
    db, _ = kb_db
    snap = Snapshot(db, kb_db=True)
    missing = tmp_path / "no_such_problem.py"
    res = kb("run", missing, "--db", db, cwd=tmp_path)
    assert_user_error(res, str(missing), "does not exist")
    assert res.returncode == 4
    snap.assert_unchanged()


def test_a_missing_problem_file_creates_no_database(tmp_path: Path) -> None:
    assert_user_error(kb("run", "nope.py", "--db", "new.db", cwd=tmp_path), "nope.py")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (
            "import torch\n\ndef get_inputs():\n    return []\n\ndef get_init_inputs():\n    return []\n",
            ["class Model"],
        ),
        ("import torch.nn as nn\n\nclass Model(nn.Module:\n    pass\n", ["syntax error", ":3"]),
        ("", ["class Model", "get_inputs()", "get_init_inputs()"]),
    ],
    ids=["no-class-Model", "syntax-error", "empty"],
)
def test_a_bad_problem_file_is_named(
    kb_db: tuple[Path, str], tmp_path: Path, text: str, names: list[str]
) -> None:
    db, _ = kb_db
    problem = tmp_path / "bad_problem.py"
    problem.write_text(text)
    snap = Snapshot(db, kb_db=True)
    res = kb("run", problem, "--db", db, cwd=tmp_path)
    assert_user_error(res, str(problem), *names)
    assert res.returncode == 4, res  # the problem's fault (EXIT_PROBLEM), not a failed run's
    snap.assert_unchanged()


RUNS = """
import os
import torch
import torch.nn as nn
{top}


class Model(nn.Module):
    def __init__(self{init_args}):
        super().__init__()
        {init}

    def forward(self, x):
        {forward}
        return torch.softmax(x, dim=1)


def get_inputs():
    {inputs}
    return [torch.rand(4, 32)]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize(
    ("where", "words"),
    [
        ({"inputs": "raise RuntimeError('dataset not found')"}, "dataset not found"),
        ({"forward": "raise ValueError('forward is broken')"}, "forward is broken"),
        ({"init": "raise OSError('no weights to download')"}, "no weights to download"),
        ({"init_args": ", needed"}, "needed"),
        ({"top": "os._exit(7)"}, "exited with status 7"),
        # weights fetched in __init__: the sandbox has no network (a listener on 127.0.0.1 is not reached)
        (
            {"init": "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9/w', timeout=5)"},
            "urlopen",
        ),
    ],
    ids=[
        "get_inputs-raises",
        "forward-raises",
        "init-raises",
        "init-inputs-missing",
        "os-exit-at-import",
        "download-in-init",
    ],
)
def test_a_problem_that_cannot_run_ends_the_run_before_any_candidate(
    tmp_path: Path, where: dict[str, str], words: str
) -> None:
    """Its fault, named in one last line with the file, exit 4, and no candidate proposed or charged."""
    parts = {"top": "", "init_args": "", "init": "pass", "forward": "pass", "inputs": "pass", **where}
    problem = tmp_path / "broken_problem.py"
    problem.write_text(RUNS.format(**parts))
    db = tmp_path / "kb.db"
    # in this process (two sandboxed children, not six): the supervised workers' way to exit 4 is
    # test_a_problem_that_fails_in_the_gates_judge_ends_the_run_uncharged's
    res = kb("run", problem, "--db", db, "--device", "cpu", "--quiet", "--inprocess", cwd=tmp_path)
    assert res.returncode == 4, (res.stdout, res.stderr)
    last = res.stdout.strip().splitlines()[-1]
    assert str(problem) in last and words in last and "cannot be evaluated" in last, last
    assert "Traceback" not in res.stdout + res.stderr
    with sqlite3.connect(db) as con:
        types = {t for (t,) in con.execute("SELECT type FROM events")}
    assert "CandidateProposed" not in types and "GatePassed" not in types, types


def test_a_hung_import_ends_the_run_within_the_analysis_timeout(tmp_path: Path) -> None:
    """A problem that never finishes importing: its fault, named, after KB_ANALYSIS_TIMEOUT_S (60 s by
    default; 5 here), not after the gate's 300 s, and no candidate proposed."""
    problem = tmp_path / "hung_problem.py"
    problem.write_text(
        RUNS.format(top="while True:\n    pass", init_args="", init="pass", forward="pass", inputs="pass")
    )
    db = tmp_path / "kb.db"
    started = time.monotonic()
    res = kb(
        "run",
        problem,
        "--db",
        db,
        "--device",
        "cpu",
        "--quiet",
        "--inprocess",
        cwd=tmp_path,
        KB_ANALYSIS_TIMEOUT_S="5",
    )
    took = time.monotonic() - started
    assert res.returncode == 4, (res.stdout, res.stderr)
    last = res.stdout.strip().splitlines()[-1]
    assert str(problem) in last and "did not finish within 5 s" in last, last
    assert took < 60, took  # the child's start, 5 s, the kill: well under a minute
    with sqlite3.connect(db) as con:
        types = {t for (t,) in con.execute("SELECT type FROM events")}
    assert "CandidateProposed" not in types, types


# traced on the meta device at its analysis, where any size is free; the gate's judge must allocate it
UNALLOCATABLE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(1 << 20, 1 << 20)]  # 4 TiB: a size written into the file, not a constant


def get_init_inputs():
    return []
"""


def test_a_problem_that_fails_in_the_gates_judge_ends_the_run_uncharged(tmp_path: Path) -> None:
    """The analysis passes (meta tensors), a candidate is proposed, and the judge cannot draw the inputs:
    the problem's fault (exit 4, its line), recorded as ProblemFailed, with no candidate failed or charged.
    (Admission would refuse this 4 TiB file first, tests/test_memory.py: a made-up card of a billion GiB
    admits it, so the judge's path is the one taken, as for a problem whose footprint has no estimate.)"""
    problem = tmp_path / "huge_problem.py"
    problem.write_text(UNALLOCATABLE)
    db = tmp_path / "kb.db"
    args = ("run", problem, "--db", db, "--device", "cpu", "--quiet", "--max-candidates", "2")
    res = kb(*args, cwd=tmp_path, KB_DEVICE_MEMORY_GIB="1e9")
    assert res.returncode == 4, (res.stdout, res.stderr)
    last = res.stdout.strip().splitlines()[-1]
    assert str(problem) in last and "cannot be evaluated" in last and "allocat" in last, last
    with sqlite3.connect(db) as con:
        rows = [(t, json.loads(p)) for t, p in con.execute("SELECT type, payload FROM events ORDER BY seq")]
        (run_id,) = con.execute("SELECT run_id FROM events LIMIT 1").fetchone()
    types = [t for t, _ in rows]
    assert "CandidateProposed" in types and types.count("ProblemFailed") == 1, types
    assert "GateFailed" not in types and "GatePassed" not in types, types
    failed = next(p for t, p in rows if t == "ProblemFailed")
    assert failed["stage"] == "gate" and "drawing the problem's inputs" in failed["error"], failed
    charged = [p["action"] for t, p in rows if t == "BudgetCharged"]
    assert not any("/gate/" in a for a in charged), charged
    finished = next(p for t, p in rows if t == "RunFinished")
    assert finished["reason"].startswith("problem failed at the gate"), finished
    assert kb("replay", run_id, "--db", db, cwd=tmp_path).returncode == 0


# --- databases that are not (this) kb's ---------------------------------------------------------------


def corrupt_db(path: Path) -> str:
    path.write_bytes(os.urandom(8192))
    return "not a readable kb database"


def newer_db(path: Path) -> str:
    EventStore(path, create=True).close()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, '0999_future', 0)"
        )
    conn.close()
    return "newer"


def foreign_db(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE recipes (name TEXT, minutes INTEGER)")
        conn.execute("INSERT INTO recipes VALUES ('soup', 40)")
    conn.close()
    return "not a kb database"


COMMANDS = {
    "run": ["run", str(PROBLEM)],
    "ls": ["ls"],
    "status": ["status", "r-some-run"],
    "resume": ["resume", "r-some-run"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(
    "make", [corrupt_db, newer_db, foreign_db], ids=["corrupt", "newer-schema", "foreign"]
)
def test_a_database_kb_cannot_use_is_refused_untouched(tmp_path: Path, make, command: str) -> None:
    db = tmp_path / "kb.db"
    what = make(db)
    snap = Snapshot(db)
    assert_user_error(kb(*COMMANDS[command], "--db", db, cwd=tmp_path), str(db), what)
    snap.assert_unchanged()


def test_a_missing_database_is_not_created_by_a_read(tmp_path: Path) -> None:
    for args in (["ls"], ["status", "r-x"], ["resume", "r-x"], ["audit", "r-x"]):
        assert_user_error(kb(*args, "--db", "absent.db", cwd=tmp_path), "absent.db")
    assert not list(tmp_path.iterdir())


# --- runs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["resume"], ["status"], ["audit"], ["replay"], ["events"], ["export", "-o", "kernel.py"]],
    ids=lambda a: a[0],
)
def test_an_unknown_run_id_is_named(kb_db: tuple[Path, str], tmp_path: Path, args: list[str]) -> None:
    db, run_id = kb_db
    unknown = "r20000101-000000-abcdef"
    assert unknown != run_id
    snap = Snapshot(db, kb_db=True)
    assert_user_error(kb(args[0], unknown, *args[1:], "--db", db, cwd=tmp_path), unknown)
    snap.assert_unchanged()
    assert not (tmp_path / "kernel.py").exists()


def test_resuming_a_finished_run_says_so_and_changes_nothing(kb_db: tuple[Path, str], tmp_path: Path) -> None:
    """Nothing to resume is no error: exit 0 (a resume-until-done loop needs no words parsed), one line."""
    db, run_id = kb_db
    snap = Snapshot(db, kb_db=True)
    r = kb("resume", run_id, "--db", db, cwd=tmp_path)
    assert (r.returncode, r.stderr) == (0, ""), (r.stdout, r.stderr)
    (line,) = r.stdout.splitlines()
    assert line.startswith(f"run {run_id} finished already: ") and line.endswith("Nothing to resume"), line
    snap.assert_unchanged()


def test_an_unknown_generator_is_named(tmp_path: Path) -> None:
    assert_user_error(
        kb("run", PROBLEM, "--generator", "no-such-gen", "--db", "kb.db", cwd=tmp_path), "no-such-gen"
    )
    assert not (tmp_path / "kb.db").exists()


def test_export_to_a_missing_directory_is_named(kb_db: tuple[Path, str], tmp_path: Path) -> None:
    db, run_id = kb_db
    out = tmp_path / "no" / "such" / "dir" / "kernel.py"
    assert_user_error(kb("export", run_id, "-o", out, "--db", db, cwd=tmp_path), str(out))
