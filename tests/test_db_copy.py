"""`kb db copy SRC DST RUN_ID`: a real run moved from SQLite to PostgreSQL and back, with its blobs and
leases, the same at every stop (status, replay, export); a second copy adds nothing; a destination
holding other events of the run is refused untouched; a bad URL is one line with the password masked.

Runs share stores: the copied events get new seqs, so the decisions among them are replayed through the
RunCopied the copy appends. Synthetic runs (tests/runs.py, stepped here as the workers would) interleave
in one source, are copied into stores holding other runs, along a chain SQLite -> PostgreSQL -> SQLite,
and one goes on at the destination and is copied back; `kb replay` agrees wherever they land."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kernelbrain.store import EventStore, NewEvent, Store, open_store

from kernelbrain.core.events import Event, RunCopied, RunFinished, RunResumed
from kernelbrain.core.policy import decision_key, policy_for
from kernelbrain.core.state import RunState
from kernelbrain.runtime.runner import prepare_resume
from kernelbrain.views.replay import replay
from kernelbrain.views.transfer import copy_run
from tests.kbcli import SOFTMAX, kb
from tests.runs import SyntheticRun

QUICK = ["--device", "cpu", "--ladder", "smallest:3:1,primary:3:1", "--quiet", "--inprocess"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, str]:
    db = tmp_path_factory.mktemp("copy") / "src.db"
    r = kb("run", str(SOFTMAX), "--db", str(db), "--max-candidates", "2", *QUICK)
    assert r.returncode == 0, r.stderr
    return db, r.stdout.split()[1]


class Synthetic(SyntheticRun):
    """A SyntheticRun under its own run id (so runs can share a store), stepped as its workers would."""

    def __init__(self, store: Store, run_id: str, **config) -> None:
        self.run_id = run_id
        super().__init__(store, max_candidates=3, **config)  # type: ignore[arg-type]

    @classmethod
    def attach(cls, store: Store, run_id: str) -> Synthetic:
        """The run as it stands in store, to go on with there."""
        run = cls.__new__(cls)
        run.store, run.run_id, run.n = store, run_id, 0  # type: ignore[assignment]
        return run

    def add(self, event: Event, key: str) -> None:
        self.store.append([event.to_new(self.run_id, f"{self.run_id}/{key}", "test")])

    def state(self) -> RunState:
        return self.store.fold(RunState(self.run_id), run_id=self.run_id)

    def schedule(self) -> list[Event]:
        state = self.state()
        out = policy_for(state.config.policy_version).decide(state)
        self.store.append([d.to_new(self.run_id, decision_key(self.run_id, d), "scheduler") for d in out])
        return out

    def step(self) -> bool:
        """One task's result, then the scheduler's decisions; False once the run has finished."""
        s = self.state()
        if s.finished is not None:
            return False
        if s.generation_tasks():
            self.gen_done(proposed=tuple(self.propose(f"{self.run_id}-c{i}") for i in range(3)))
        elif s.gate_tasks():
            self.gate(s.gate_tasks()[0].id)
        elif s.bench_tasks():
            c, rung = s.bench_tasks()[0]
            self.bench(c.id, rung, 1.0 + 0.5 * c.ordinal)
        elif s.profile_tasks():
            self.profile(s.profile_tasks()[0].id)
        self.schedule()
        return True


def interleaved(db: Path, *run_ids: str, stop: int | None = None) -> None:
    """The runs in db, one step of each in turn, all finished (the first one stopped after `stop` steps)."""
    with EventStore(db) as store:
        runs = [Synthetic(store, r) for r in run_ids]
        steps = 0
        while any([run.step() for run in runs[1:]] + [(stop is None or steps < stop) and runs[0].step()]):
            steps += 1
        seqs = {r: [e.seq for e in store.read(run_id=r)] for r in run_ids}
    # two or more runs interleave: none holds a run of consecutive seqs
    assert len(run_ids) == 1 or all(s != list(range(s[0], s[0] + len(s))) for s in seqs.values())


def decisions(store: Store, run_id: str) -> list[tuple[str, int]]:
    return [(e.key, e.payload["basis"]) for e in store.read(run_id=run_id) if "basis" in e.payload]


REPLAYED = "replayed 20 events, 3 candidates: 5 decisions agree with policy v4\n"


def test_interleaved_runs_go_sqlite_to_postgres_to_sqlite_among_other_runs(pg_url: str, tmp_path) -> None:
    src, other, back = tmp_path / "src.db", tmp_path / "other.db", tmp_path / "back.db"
    interleaved(src, "ra", "rb")
    interleaved(other, "rc")
    interleaved(back, "rd")
    with open_store(src, readonly=True) as a, open_store(other) as b, open_store(pg_url) as pg:
        want = {r: replay(a, r) for r in ("ra", "rb")}
        assert all(w.agrees and w.decisions == 5 for w in want.values())
        for r in ("rb", "ra"):  # into a store holding another run: every seq differs from src's
            assert copy_run(a, b, r).replay == want[r]
        assert [e.run_id for e in b.read(types=["RunCopied"])] == ["rb", "ra"]
        assert decisions(b, "ra") == decisions(a, "ra")  # not rewritten: read through the RunCopied
        copy_run(a, pg, "rb")
    r = kb("db", "copy", str(src), pg_url, "ra")
    assert r.returncode == 0 and "replay of 20 events agrees (5 decisions)" in r.stdout, r.stderr
    r = kb("db", "copy", pg_url, str(back), "ra")  # a copy of a copy
    assert r.returncode == 0 and "replay of 20 events agrees (5 decisions)" in r.stdout, r.stderr
    for db in (other, back):
        r = kb("replay", "ra", "--db", str(db))
        assert (r.returncode, r.stdout) == (0, REPLAYED), r.stderr
    with open_store(src) as a, open_store(back, readonly=True) as c:
        native = a.read(run_id="ra")
        copied = c.read(run_id="ra")
        assert [(e.key, e.payload, e.ts) for e in copied[:20]] == [(e.key, e.payload, e.ts) for e in native]
        assert [e.type for e in copied[20:]] == ["RunCopied"]  # src -> pg's; pg -> back needs none more
        home = copy_run(c, a, "ra")  # back home: the RunCopied is all that src lacks
        assert (home.copied, home.already, home.replay.agrees) == (1, 20, True)
        assert copy_run(c, a, "ra").copied == 0


def test_a_run_gone_on_at_the_destination_replays_there_and_copies_back(tmp_path) -> None:
    src, dst = tmp_path / "src.db", tmp_path / "dst.db"
    interleaved(src, "ra", "rb", stop=7)  # ra: gated, measured at rung 0, one promotion, then stopped
    interleaved(dst, "rc")
    with open_store(src, readonly=True) as a, open_store(dst) as b:
        assert len(decisions(a, "ra")) == 1 and a.read(run_id="ra", types=["RunFinished"]) == []
        copy_run(a, b, "ra")
        prepare_resume(b, "ra")  # `kb resume` at the destination; its workers' results are these steps
        run = Synthetic.attach(b, "ra")
        while run.step():
            pass
        mark = b.read(run_id="ra", types=["RunCopied"])[0].seq
        assert len([d for d in decisions(b, "ra") if d[1] > mark]) == 4  # decided there, on its seqs
    r = kb("replay", "ra", "--db", str(dst))
    assert (r.returncode, r.stdout) == (
        0,
        "replayed 21 events, 3 candidates: 5 decisions agree with policy v4\n",
    )
    r = kb("db", "copy", str(dst), str(src), "ra", "--json")
    assert r.returncode == 0, r.stderr
    # RunCopied, RunResumed and 7 more after the 13 it had
    assert (json.loads(r.stdout)["copied"], json.loads(r.stdout)["already"]) == (9, 13)
    with open_store(src, readonly=True) as a:
        assert [e.type for e in a.read(run_id="ra", types=["RunCopied"])] == ["RunCopied"] * 2
        assert decisions(a, "ra") == decisions(EventStore(dst, readonly=True), "ra")


def test_a_copy_cut_short_is_finished_by_the_next(tmp_path) -> None:
    src, dst = tmp_path / "src.db", tmp_path / "dst.db"
    interleaved(src, "ra", "rb")
    with open_store(src, readonly=True) as a, open_store(dst) as b:
        first = a.read(run_id="ra")[:12]  # as far as a copy got before it stopped: one decision among them
        b.append(
            [
                NewEvent(e.run_id, e.type, e.version, e.key, e.payload, e.actor, e.subject, e.stage)
                for e in first
            ],
            ts=[e.ts for e in first],
        )
        report = copy_run(a, b, "ra")
        assert (report.copied, report.already, report.replay.agrees) == (8, 12, True)


def test_a_basis_the_run_cannot_have_is_a_divergence_and_such_a_run_is_not_copied(tmp_path) -> None:
    src, dst = tmp_path / "src.db", tmp_path / "dst.db"
    interleaved(src, "ra", "rb")
    with open_store(src) as a:
        ra_started = a.read(run_id="ra")[0].seq  # before rb's RunStarted
        forged = RunFinished(
            basis=ra_started, reason="forged", winner=None, winner_rung=None, winner_score=None
        )
        a.append([forged.to_new("rb", "rb/forged", "test")])
        lost = RunCopied(source="elsewhere", events=20, seqs=a.put_blob("[1, 2]"))
        a.append([lost.to_new("ra", "ra/copied/20", "test")])
        assert replay(a, "rb").divergences == [
            f"#{a.last_seq() - 1} RunFinished : its basis #{ra_started} comes before the run's RunStarted"
        ]
        assert replay(a, "ra").divergences == [
            f"#{a.last_seq()} RunCopied: its blob does not hold 20 increasing seqs, one per event ahead"
        ]
    r = kb("db", "copy", str(src), str(dst), "rb")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"Error: run rb at {src} does not replay (") and "nothing copied" in r.stderr
    with open_store(dst, readonly=True) as b:
        assert b.last_seq() == 0


def seen(db: str, run_id: str, tmp_path: Path) -> tuple[dict, str, str]:
    """What kb shows of the run in db: its status, its replay line, its exported winner."""
    status = kb("status", run_id, "--db", db, "--json")
    replay = kb("replay", run_id, "--db", db)
    out = tmp_path / f"k{abs(hash(db))}.py"
    export = kb("export", run_id, "--db", db, "-o", str(out))
    assert status.returncode == replay.returncode == export.returncode == 0, status.stderr + replay.stderr
    return json.loads(status.stdout), replay.stdout, out.read_text()


def test_a_run_goes_to_postgres_and_back_unchanged(finished_run, pg_server, pg_url: str, tmp_path) -> None:
    src, run_id = finished_run
    back = tmp_path / "back.db"
    with open_store(pg_url) as pg:
        Synthetic(pg, "other")  # a run already there: the copy's seqs are not the source's
    first = kb("db", "copy", str(src), pg_url, run_id)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"copied run {run_id} from {src} to postgresql://kb:***@127.0.0.1")
    assert "replay of" in first.stdout and "agrees" in first.stdout
    assert pg_server.password not in first.stdout + first.stderr
    r = kb("db", "copy", pg_url, str(back), run_id, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["copied"] > 10 and report["already"] == 0 and report["blobs"] >= 3  # problem, 2 sources
    want = seen(str(src), run_id, tmp_path)
    assert seen(pg_url, run_id, tmp_path) == want
    assert seen(str(back), run_id, tmp_path) == want
    with open_store(src, readonly=True) as a, open_store(back, readonly=True) as b:
        n = a.count(run_id=run_id)
        assert [(e.key, e.type, e.payload, e.actor, e.ts) for e in a.read(run_id=run_id)] == [
            (e.key, e.type, e.payload, e.actor, e.ts) for e in b.read(run_id=run_id)[:n]
        ]
        assert [e.type for e in b.read(run_id=run_id)[n:]] == ["RunCopied"]  # src -> pg's
        tasks = {e.payload["task"] for e in a.read(run_id=run_id, types=["TaskClaimed"])}
        assert tasks and all(a.lease(t).token == b.lease(t).token for t in tasks)
        assert all(a.is_done(t) == b.is_done(t) for t in tasks)
    again = kb("db", "copy", str(src), pg_url, run_id, "--json")
    assert again.returncode == 0, again.stderr
    assert (json.loads(again.stdout)["copied"], json.loads(again.stdout)["already"]) == (0, n)
    assert report["copied"] == n + 1  # pg's log, its RunCopied included


def test_a_destination_holding_other_events_of_the_run_is_refused(finished_run, tmp_path) -> None:
    src, run_id = finished_run
    dst = tmp_path / "dst.db"
    assert kb("db", "copy", str(src), str(dst), run_id).returncode == 0
    with open_store(dst) as store:
        extra = RunResumed(attempt=1, hardware={}).to_new(run_id, f"{run_id}/resumed/1", "elsewhere")
        store.append([extra])
        before = store.last_seq()
    r = kb("db", "copy", str(src), str(dst), run_id)
    assert r.returncode == 1
    assert r.stderr.startswith(f"Error: {dst} already holds ") and "nothing copied" in r.stderr
    assert r.stderr.count("\n") == 1
    with open_store(dst, readonly=True) as store:
        assert store.last_seq() == before
    missing = kb("db", "copy", str(src), str(tmp_path / "x.db"), "no-such-run")
    assert missing.returncode == 1 and "no run 'no-such-run'" in missing.stderr


def test_an_unreachable_destination_is_one_line(finished_run) -> None:
    from tests.pg_server import free_port

    src, run_id = finished_run
    r = kb("db", "copy", str(src), f"postgresql://kb:pw-s3cret@127.0.0.1:{free_port()}/kb", run_id)
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("Error: cannot reach the PostgreSQL server at postgresql://kb:***@127.0.0.1")
    assert "pw-s3cret" not in r.stderr
