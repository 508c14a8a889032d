"""Make the in-tree packages importable when the distribution is not pip-installed; one PostgreSQL server
per session and a fresh database per test that asks for one; a warm sandbox child per module beside the
session's judge; a template test module's problem variants and their traces; and, under pytest-xdist,
tests marked `exclusive` run with no other test beside them, and tests marked `long` are started first.

A test that needs what the machine may lack (tests/needs.py: PostgreSQL, Chromium, bubblewrap; the
`pg_server` fixture, or the mark `needs("chromium")`) is skipped where it is missing, and the session
ends with one line per missing piece naming the tests skipped for it; under CI (CI=true) it fails."""

import atexit
import fcntl
import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from kernelbrain.core.protocol import AnalyseRequest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import needs  # noqa: E402  (the in-tree packages first)

# the device lock (kernelbrain/runtime/gpu_lock.py) of this test process and of the kb processes it
# starts: one folder a pytest-xdist worker, so that one test's timing never waits for another test's
# gates (the runs of one test still exclude each other: tests/test_batch.py checks it)
os.environ["KB_LOCKS"] = tempfile.mkdtemp(prefix="kb-locks-")
atexit.register(shutil.rmtree, os.environ["KB_LOCKS"], ignore_errors=True)


def require(piece: str) -> None:
    """Skip the test when the piece is missing here, with the one line that says so; under CI, fail it."""
    why = needs.reason(piece)
    if why is None:
        return
    if needs.in_ci():
        pytest.fail(f"CI is set and {why}", pytrace=False)
    pytest.skip(why)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(*pieces): the test needs these pieces of tests/needs.py (skipped where missing)"
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        for piece in mark.args:
            require(piece)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A skip for a missing piece is reported at require(), not at the test (pytest's choice for a skip
    raised in a fixture), so pytest's short summary folds each piece's skips into one line."""
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple) and needs.is_missing(str(report.longrepr[2])):
        report.longrepr = (__file__, require.__code__.co_firstlineno, report.longrepr[2])
    return report


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter) -> None:
    """One line per missing piece: what it is, how to get it, and the tests skipped for it per file."""
    skipped = terminalreporter.stats.get("skipped", [])
    for piece in needs.PIECES.values():
        files = Counter(
            r.nodeid.split("::")[0].rsplit("/", 1)[-1]
            for r in skipped
            if isinstance(r.longrepr, tuple) and needs.is_missing(str(r.longrepr[2]), piece.name)
        )
        if files:
            n = files.total()
            tests = ", ".join(f"{name} {k}" for name, k in sorted(files.items()))
            terminalreporter.write_line(
                f"missing {piece.what}: {n} test{'s' * (n != 1)} skipped ({tests})", yellow=True
            )


@pytest.fixture(scope="session")
def pg_server():
    """One real PostgreSQL server for the whole session (per xdist worker), started on first use. A test
    that needs it is skipped where PostgreSQL is not installed (failed under CI), and fails when an
    installed server cannot start (tests/pg_server.py)."""
    from tests.pg_server import PgServer

    require("postgresql")
    server = PgServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server) -> str:
    """A fresh, empty database on the session's server: its postgresql:// URL (password included)."""
    return pg_server.new_database()


@pytest.fixture(scope="session")
def shared_box():
    """The session's warm CPU sandbox (`box`): its judge, where no candidate code runs, serves every
    module, as a pool worker's serves every problem of a batch."""
    from kernelbrain.runtime.sandbox import Sandbox

    sb = Sandbox("cpu", fresh_untrusted=False)
    try:
        yield sb
    finally:
        sb.close()


@pytest.fixture(scope="module")
def box(shared_box):
    """One warm CPU sandbox child per test module (torch and Triton import once), shared by the module's
    candidates and stopped after them; its judge lives on for the next module (a torch import each). A
    test about the fresh child each candidate from outside gets makes its own Sandbox."""
    try:
        yield shared_box
    finally:
        shared_box.stop()  # what the module's candidates ran in goes: the next module's start clean
        if shared_box.spare is not None:
            shared_box.spare.end()
            shared_box.spare = None


@pytest.fixture(scope="module")
def problems(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The test module's `problem_variants()` (name -> problem source) written to files and read back
    through the static check, as kb reads them."""
    from kernelbrain.core.problem import read_problem

    tmp = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    out = {}
    for name, text in request.module.problem_variants().items():
        (tmp / f"{name}.py").write_text(text)
        out[name] = read_problem(tmp / f"{name}.py")
    return out


@pytest.fixture(scope="module")
def analyses(request: pytest.FixtureRequest, box, problems: dict[str, str]) -> dict[str, dict]:
    """Each problem variant traced on CPU, and each of the module's OTHER_PROBLEMS (name -> path: other
    families' problems, which its family must not match). Traced in the box's judge, as `kb check` does:
    a candidate's child started before the judge cannot see its draws, and a first gate would start
    another."""
    others = {name: path.read_text() for name, path in getattr(request.module, "OTHER_PROBLEMS", {}).items()}
    box.start_judge()
    return {
        name: box.judge.call(AnalyseRequest(problem_source=src, device="cpu"), timeout_s=120)[0].model_dump()
        for name, src in {**problems, **others}.items()
    }


def _session_dir(config: pytest.Config) -> Path | None:
    """The folder all xdist workers of this session share (each one's basetemp is a folder in it)."""
    basetemp = getattr(config.option, "basetemp", None)
    if not basetemp or not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return Path(basetemp).resolve().parent


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Every test holds a shared lock while it runs (setup to teardown); an `exclusive` one (a timing
    that another worker's load would distort) holds it exclusively. A test waiting for the exclusive lock
    first takes the turnstile, which every test passes on its way in, so it is not starved."""
    folder = _session_dir(item.config)
    if folder is None:  # not under xdist: nothing runs beside this test anyway
        return (yield)
    exclusive = item.get_closest_marker("exclusive") is not None
    with open(folder / "kb-tests.turnstile", "a") as turnstile, open(folder / "kb-tests.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            return (yield)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `long` (minutes each: whole runs killed and resumed) first, the rest in their order:
    started last, they ran alone on one worker while the others sat idle (CI's two cores)."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
