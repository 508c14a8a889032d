"""`kb report`: the HTML page holds the numbers the run's events hold, and a real browser draws its plots.

Two runs: tests/fixtures/softmax_run.db (a recorded real run: eight candidates, a mutation round, no
failures) and a run written here with the real scheduler deciding (gate failures of three categories,
a fault on the ladder, and a winner that is a mutation of its parent, so there is a diff to show).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest
from kernelbrain.store import EventStore

from kernelbrain.core.events import (
    BenchmarkFailed,
    CandidateProposed,
    GateFailed,
    GatePassed,
    ProfileCaptured,
    RungBenchmarked,
    decode,
)
from kernelbrain.views.report import render, write_report
from kernelbrain.views.report_data import load_report_state
from tests.kbcli import kb
from tests.runs import RUN, SyntheticRun

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE_RUN = "r20261129-224558-531825"
CHROMIUM = shutil.which("chromium")


# --- a small DOM, enough to read the page's tables and tree ----------------------------------------


class Node:
    def __init__(self, tag: str, attrs: dict[str, str], parent: Node | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node] = []
        self.parts: list[str] = []

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.parts + [c.text for c in self.children]).split())

    def find_all(self, tag: str, **attrs: str) -> list[Node]:
        out = []
        for c in self.children:
            if c.tag == tag and all(v in c.attrs.get(k, "").split() for k, v in attrs.items()):
                out.append(c)
            out += c.find_all(tag, **attrs)
        return out

    def find(self, tag: str, **attrs: str) -> Node:
        (hit, *_) = self.find_all(tag, **attrs)
        return hit


class Dom(HTMLParser):
    VOID = {"meta", "br", "img", "link", "input", "hr"}

    def __init__(self, page: str) -> None:
        super().__init__()
        self.root = self.at = Node("#root", {}, None)
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs}, self.at)
        self.at.children.append(node)
        if tag not in self.VOID:
            self.at = node

    def handle_endtag(self, tag):
        walk = self.at
        while walk is not None and walk.tag != tag:
            walk = walk.parent
        if walk is not None and walk.parent is not None:
            self.at = walk.parent

    def handle_data(self, data):
        self.at.parts.append(data)


def section(page: str, anchor: str) -> Node:
    return Dom(page).root.find("section", id=anchor)


def table_rows(node: Node, cls: str) -> list[list[str]]:
    return [
        [td.text for td in tr.find_all("td")] for tr in node.find("table", **{"class": cls}).find_all("tr")
    ][1:]


def parents_in_tree(page: str) -> dict[str, str | None]:
    """candidate -> the candidate whose <li> holds its <li> in the lineage tree."""
    out: dict[str, str | None] = {}
    for li in section(page, "lineage").find_all("li", **{"class": "node"}):
        up = li.parent
        while up is not None and not (up.tag == "li" and "data-candidate" in up.attrs):
            up = up.parent
        out[li.attrs["data-candidate"]] = up.attrs["data-candidate"] if up else None
    return out


# --- the runs --------------------------------------------------------------------------------------


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    db = tmp_path / "softmax_run.db"
    shutil.copy(FIXTURES / "softmax_run.db", db)  # opening may add -wal/-shm files: never beside the fixture
    return db


PARENT_SRC = "import triton\n\nBLOCK = 1024\nWARPS = 4\n\n\nclass ModelNew:\n    pass\n"
CHILD_SRC = PARENT_SRC.replace("BLOCK = 1024", "BLOCK = 2048")
ROOFLINE = {"time_s": 1e-3, "bytes": 1e6, "flops": 2.5e5, "bandwidth_Bps": 2e9, "matmul_flops": 1e11}
# candidate -> (parent, how the gate ends, speedup per rung or the rung where it faults)
PLAN: dict[str, tuple[str | None, str, float | int]] = {
    "root-a": (None, "pass", 2.0),
    "root-b": (None, "pass", 1.0),
    "root-c": (None, "compile", 0),
    "root-d": (None, "timeout", 0),
    "root-e": (None, "pass", -1),  # faults on rung 0
    "mut-a1": ("root-a", "pass", 3.0),
    "mut-a2": ("root-a", "mismatch", 0),
    "mut-a3": ("root-a", "compile", 0),
}


def build_run(db: Path) -> None:
    """A run with the real scheduler deciding: gate, ladder and profile results come from PLAN."""
    store = EventStore(db, create=True)
    run = SyntheticRun(store, eta=2, max_candidates=len(PLAN))

    def propose(cid: str, parent: str | None) -> None:
        src = CHILD_SRC if cid == "mut-a1" else PARENT_SRC.replace("1024", str(1024 + len(cid) * run.n))
        run.add(
            CandidateProposed(
                candidate=cid,
                source=store.put_blob(src),
                parent=parent,
                generator="test",
                family="row_softmax",
                strategy="s",
                knobs={"i": run.n},
                round=0 if parent is None else 1,
                hint="block size" if parent else "strategy axis s",
            ),
            f"propose/{cid}",
        )
        run.n += 1

    for cid, (parent, _, _) in PLAN.items():
        if parent is None:
            propose(cid, None)
    run.gen_done("round0", tuple(c for c, p in PLAN.items() if p[0] is None))
    while True:
        state = run.state()
        acted = False
        for c in state.gate_tasks():
            _, verdict, _ = PLAN[c.id]
            run.add(
                GatePassed(candidate=c.id, seeds=3, max_abs_err=0, max_rel_err=0, tolerance=1e-4)
                if verdict == "pass"
                else GateFailed(candidate=c.id, category=verdict, detail=f"{c.id} failed: {verdict}"),
                f"gate/{c.id}",
            )
            run.charge(0.25)
            acted = True
        for c, rung in state.bench_tasks():
            sp = PLAN[c.id][2]
            if sp < 0:
                run.add(
                    BenchmarkFailed(candidate=c.id, rung=rung, category="timeout", detail="too slow"),
                    f"bench/{c.id}/{rung}",
                )
            else:
                run.bench(c.id, rung, sp * (1 + rung / 10))
            run.charge(1.0 + rung)
            acted = True
        for c in state.profile_tasks():
            run.add(
                ProfileCaptured(
                    candidate=c.id,
                    source="roofline",
                    metrics=ROOFLINE,
                    labels=["latency or occupancy-limited"],
                ),
                f"profile/{c.id}",
            )
            run.charge(0.5)
            acted = True
        for task in state.generation_tasks():
            parent = task.removeprefix("mutate/")
            kids = [c for c, p in PLAN.items() if p[0] == parent]
            for k in kids:
                propose(k, parent)
            run.gen_done(task, tuple(kids))
            acted = True
        acted = bool(run.schedule()) or acted
        if run.state().finished is not None or not acted:
            break
    store.close()


@pytest.fixture
def written(tmp_path: Path) -> Path:
    db = tmp_path / "written.db"
    build_run(db)
    return db


def report_of(db: Path, run_id: str, tmp_path: Path) -> str:
    with EventStore(db, create=False) as store:
        out = write_report(store, run_id, tmp_path / f"{run_id}.html")
    return out.read_text(encoding="utf-8")


def events_of(db: Path, run_id: str) -> list:
    with EventStore(db, create=False) as store:
        return [decode(r) for r in store.read(run_id=run_id)]


# --- content ---------------------------------------------------------------------------------------


def test_recorded_run_report_holds_its_numbers(recorded, tmp_path):
    page = report_of(recorded, FIXTURE_RUN, tmp_path)
    evs = events_of(recorded, FIXTURE_RUN)
    finished = next(e for e in evs if e.TYPE == "RunFinished")
    winner = finished.winner
    assert winner == "2631602c44e7be1a"

    summary = Dom(page).root.find("table", **{"class": "kv"})
    assert any(r[0] == "winner" and r[1].startswith(winner) for r in table_rows(summary.parent, "kv"))
    gpu = sum(e.gpu_s for e in evs if e.TYPE == "BudgetCharged")
    assert f"{gpu:.4g} s" in summary.text

    # best speedup: the winner's top-rung per-shape speedups, their geomean, and the device time
    top = max((e for e in evs if e.TYPE == "RungBenchmarked" and e.candidate == winner), key=lambda e: e.rung)
    geo = math.exp(sum(math.log(s.speedup) for s in top.shapes) / len(top.shapes))
    sp = section(page, "speedup")
    assert sp.find("b", **{"class": "best-speedup"}).text == f"{geo:.4g}x"
    assert f"of {gpu:.4g} device seconds" in sp.text
    assert [r[0] for r in table_rows(sp, "shapes")] == [s.shape for s in top.shapes]
    assert [r[-1] for r in table_rows(sp, "shapes")] == [f"{s.speedup:.4g}x" for s in top.shapes]

    # funnel: candidates measured per rung, promoted from it, pruned at it
    measured = Counter(e.rung for e in evs if isinstance(e, RungBenchmarked))
    promoted = Counter(e.rung_from for e in evs if e.TYPE == "Promoted")
    pruned = Counter(e.rung for e in evs if e.TYPE == "Pruned")
    assert (measured[0], measured[1], measured[2]) == (8, 5, 3)
    rows = {r[0]: r[1:] for r in table_rows(section(page, "funnel"), "funnel")}
    assert rows["proposed"][0] == "8"
    assert rows["gated"][:4] == ["8", "", "8", "0"]
    for rung in range(3):
        reached, meas, _, failed, prom, prun = rows[f"rung {rung}"]
        assert (int(meas), int(failed), int(prom), int(prun)) == (
            measured[rung],
            0,
            promoted[rung],
            pruned[rung],
        )
        assert int(reached) == (8 if rung == 0 else promoted[rung - 1])
    assert rows["profiled"][0] == str(sum(e.TYPE == "ProfileCaptured" for e in evs)) == "3"

    # lineage: every proposal, under its parent, with its outcome
    proposals = [e for e in evs if isinstance(e, CandidateProposed)]
    assert parents_in_tree(page) == {p.candidate: p.parent for p in proposals}
    lineage = section(page, "lineage")
    statuses = {li.attrs["data-candidate"]: li.attrs["data-status"] for li in lineage.find_all("li")}
    assert statuses[winner] == "winner"
    assert sum(s == "pruned" for s in statuses.values()) == sum(pruned.values()) == 5
    assert sum(s == "finalist" for s in statuses.values()) == 2  # profiled, beaten by the winner
    n_prom = sum(promoted.values())
    assert f"{len(proposals)} candidates, {n_prom} promotions, {sum(pruned.values())} prunes" in lineage.text

    # no failures in this run
    assert (
        "0 candidate(s) failed the gate and 8 passed it; 0 faulted on the ladder."
        in section(page, "failures").text
    )
    assert 'data-plot="failures"' not in page

    # the winner's roofline, from its ProfileCaptured
    prof = next(e for e in evs if isinstance(e, ProfileCaptured) and e.candidate == winner)
    m = prof.metrics
    roof = section(page, "profile")
    assert ", ".join(prof.labels) in roof.text
    bw = m["bytes"] / m["time_s"]
    assert f"{bw / 1e9:.4g} GB/s, {bw / m['bandwidth_Bps'] * 100:.3g}% of" in roof.text
    assert 'data-plot="roofline"' in page

    # the winner's source; it is a root, so there is no diff
    with EventStore(recorded, create=False) as store:
        src = store.get_blob(next(p.source for p in proposals if p.candidate == winner)).decode()
    source = section(page, "source")
    assert source.find("pre", **{"class": "source"}).text == " ".join(src.split())
    assert "A root candidate (no parent" in source.text


def test_written_run_counts_failures_and_diffs_the_winner_against_its_parent(written, tmp_path):
    page = report_of(written, RUN, tmp_path)
    evs = events_of(written, RUN)
    gate = Counter(e.category for e in evs if isinstance(e, GateFailed))
    ladder = Counter(e.category for e in evs if isinstance(e, BenchmarkFailed))
    assert gate == {"compile": 2, "timeout": 1, "mismatch": 1} and ladder == {"timeout": 1}

    fails = section(page, "failures")
    passed = sum(isinstance(e, GatePassed) for e in evs)
    assert f"4 candidate(s) failed the gate and {passed} passed it; 1 faulted on the ladder." in fails.text
    rows = {r[0]: (int(r[1]), int(r[2])) for r in table_rows(fails, "failures")}
    assert rows == {c: (gate[c], ladder[c]) for c in gate | ladder}
    assert 'data-plot="failures"' in page

    finished = next(e for e in evs if e.TYPE == "RunFinished")
    assert finished.winner == "mut-a1"
    funnel = {r[0]: r[1:] for r in table_rows(section(page, "funnel"), "funnel")}
    assert funnel["gated"][:4] == ["8", "", str(passed), "4"]
    assert funnel["rung 0"][3] == "1"  # root-e faulted there

    lineage = section(page, "lineage")
    statuses = {li.attrs["data-candidate"]: li.attrs["data-status"] for li in lineage.find_all("li")}
    assert statuses == {
        "root-a": "finalist",
        "root-b": "pruned",
        "root-c": "failed",
        "root-d": "failed",
        "root-e": "failed",
        "mut-a1": "winner",
        "mut-a2": "failed",
        "mut-a3": "failed",
    }
    assert parents_in_tree(page) == {c: p for c, (p, _, _) in PLAN.items()}
    on_path = {li.attrs["data-candidate"] for li in lineage.find_all("li", **{"class": "on-path"})}
    assert on_path == {"mut-a1", "root-a"}

    source = section(page, "source")
    diff = [(s.attrs["class"], s.text) for s in source.find("pre", **{"class": "diff"}).find_all("span")]
    assert [t for c, t in diff if c in ("add", "del")] == ["-BLOCK = 1024", "+BLOCK = 2048"]
    assert "1 line(s) added, 1 removed" in source.text
    assert source.find("pre", **{"class": "source"}).text == " ".join(CHILD_SRC.split())

    roof = section(page, "profile")
    assert "0.25 GFLOP/s, 0.25% of 100 GFLOP/s" in roof.text  # 2.5e5 FLOP in 1 ms against 1e11 FLOP/s
    assert "1 GB/s, 50% of 2 GB/s" in roof.text

    # best speedup: the winner at the top rung, measured after the device time charged up to it
    with EventStore(written, create=False) as store:
        state = load_report_state(store, RUN)
        (when,) = [x for x, r in state.timeline() if r.candidate == "mut-a1" and r.rung == 2]
        assert render(store, state) == page  # the page is a pure function of the log
    spent, seen = 0.0, False
    for e in evs:  # the device time charged up to and including the charge that paid for it
        if e.TYPE == "BudgetCharged":
            spent += e.gpu_s
            if seen:
                break
        seen = seen or (isinstance(e, RungBenchmarked) and e.candidate == "mut-a1" and e.rung == 2)
    assert when == pytest.approx(spent)
    assert f"measured after {spent:.4g} of" in section(page, "speedup").text
    assert section(page, "speedup").find("b", **{"class": "best-speedup"}).text == f"{3.0 * 1.2:.4g}x"


def test_a_run_in_progress_reports_what_it_has(tmp_path):
    with EventStore(tmp_path / "live.db", create=True) as store:
        run = SyntheticRun(store)
        page = render(store, load_report_state(store, RUN))
        assert "No candidate has been measured yet." in section(page, "speedup").text
        assert "No candidate has been proposed yet." in section(page, "lineage").text
        assert "data-plot" in page and 'data-plot="speedup"' not in page  # only the (empty) funnel
        run.propose("a")
        run.gate("a")
        run.bench("a", 0, 1.5)
        page = render(store, load_report_state(store, RUN))
    rows = table_rows(Dom(page).root, "kv")
    assert ["leader (run not finished)", "a (row_softmax/s)"] in rows
    assert section(page, "speedup").find("b", **{"class": "best-speedup"}).text == "1.5x"
    assert "was not profiled" in section(page, "profile").text


def test_the_page_is_self_contained(recorded, written, tmp_path):
    for db, run in ((recorded, FIXTURE_RUN), (written, RUN)):
        page = report_of(db, run, tmp_path)
        for needle in ("<script", "<link", "<img", "<iframe", "<object", " src=", "@import"):
            assert needle not in page, needle
        refs = re.findall(r'href="([^"]*)"', page) + re.findall(r"url\(([^)]*)\)", page)
        assert refs and all(r.startswith("#") for r in refs), [r for r in refs if not r.startswith("#")]


# --- the command -----------------------------------------------------------------------------------


def test_kb_report_writes_the_page(recorded, tmp_path):
    out = tmp_path / "report.html"
    r = kb("report", FIXTURE_RUN, "--db", str(recorded), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"wrote {out}"
    assert 'data-candidate="2631602c44e7be1a" data-status="winner"' in out.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("run_id", "output", "message"),
    [
        ("no-such-run", "report.html", "Error: no run 'no-such-run' in "),
        (FIXTURE_RUN, "missing-folder/report.html", "Error: cannot write "),
    ],
)
def test_kb_report_bad_input_is_one_line(recorded, tmp_path, run_id, output, message):
    r = kb("report", run_id, "--db", str(recorded), "-o", str(tmp_path / output))
    assert r.returncode == 1
    assert r.stderr.startswith(message) and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / output).exists()


# --- a real browser --------------------------------------------------------------------------------

PROBE = """<script>
const plots = [...document.querySelectorAll('figure.plot')].map(f => {
  const svg = f.querySelector('svg');
  const box = svg.getBoundingClientRect();
  const drawn = [...svg.querySelectorAll('path, use, text')].filter(e => {
    const b = e.getBBox(); return b.width > 0 || b.height > 0;
  }).length;
  return {name: f.dataset.plot, width: box.width, height: box.height, drawn};
});
const probe = document.createElement('pre');
probe.id = 'probe';
probe.textContent = JSON.stringify({
  plots, nodes: document.querySelectorAll('li.node').length,
  resources: performance.getEntriesByType('resource').map(e => e.name),
});
document.body.appendChild(probe);
</script></body>"""


@pytest.mark.needs("chromium")
def test_chromium_draws_every_plot(written, tmp_path):
    assert CHROMIUM is not None
    page = report_of(written, RUN, tmp_path)
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", PROBE), encoding="utf-8")
    r = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1200,900",
            "--dump-dom",
            probed.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    dom = Dom(r.stdout).root
    probe = json.loads(dom.find("pre", id="probe").text)
    assert probe["resources"] == []  # nothing fetched: the page is whole offline
    assert probe["nodes"] == len(PLAN)
    plots = {p["name"]: p for p in probe["plots"]}
    assert set(plots) == {"speedup", "funnel", "failures", "roofline"}
    for p in plots.values():
        assert p["width"] > 300 and p["height"] > 100, p
        assert p["drawn"] > 20, p  # axes, ticks, bars, points and labels laid out with a size
