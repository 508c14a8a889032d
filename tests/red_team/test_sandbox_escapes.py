"""The sandbox against candidates that try to leave it, through `kb check`'s own function in a child
process holding a real secret in its environment: each attack is a correct softmax that returns zeros
if the attack got through, so the gate's verdict says whether it did. Each is run twice: under the
sandbox kb picks here (bubblewrap, which .ci/run installs), where it must fail to get out, and under
KB_SANDBOX=none, where it must succeed, which shows the attack is real. The attacks import os, socket
and subprocess, which kb's candidate subset refuses before any child starts (`kb check` says `policy`):
to test the sandbox beneath it, the check runs `trusted`, as for code kb wrote itself."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.kbcli import SOFTMAX, kb, kb_env
from tests.red_team.test_gate_cheats import softmax_cheat

SECRET = "sk-kb-red-team-secret-7f3a"
FIXTURE_DB = Path(__file__).resolve().parents[1] / "fixtures" / "softmax_run.db"

pytestmark = pytest.mark.needs("bwrap")

# the attack runs in forward, after an honest kernel: zeros if it got through
ATTACKED = """
try:
    escaped = attack()
except Exception:
    escaped = False
y = kernel_softmax(x, torch.empty_like(x))
return torch.zeros_like(y) if escaped else y
"""


def indent(code: str) -> str:
    return "\n".join("    " + line for line in code.strip().splitlines())


# `kb check PROBLEM CANDIDATE --json` past the candidate subset
TRUSTED_CHECK = """
import json, sys
from kernelbrain.commands.options import resolve_device
from kernelbrain.runtime.check import check
print(json.dumps(check(sys.argv[1], sys.argv[2], resolve_device("auto"), trusted=True).model_dump()))
"""


def check(tmp_path: Path, attack: str, level: str | None = None) -> dict:
    """`kb check` of the attack's candidate, the secret in its environment; its JSON verdict."""
    cand = tmp_path / f"attack_{level or 'default'}.py"
    top = "import os, socket, sqlite3, subprocess\n\n\ndef attack():\n" + indent(attack) + "\n"
    cand.write_text(softmax_cheat(ATTACKED, top=top))
    env = kb_env(OPENAI_API_KEY=SECRET, KB_LLM_API_KEY=SECRET)
    env.pop("KB_SANDBOX", None)
    if level is not None:
        env["KB_SANDBOX"] = level
    r = subprocess.run(
        [sys.executable, "-c", TRUSTED_CHECK, str(SOFTMAX), str(cand)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.stdout.strip(), r.stderr
    return json.loads(r.stdout)


def assert_held(tmp_path: Path, attack: str) -> None:
    held = check(tmp_path, attack)
    assert held["passed"] is True, f"the attack got out of the sandbox: {held}"
    loose = check(tmp_path, attack, "none")
    assert loose["passed"] is False and loose["category"] == "mismatch", f"the attack is not real: {loose}"


def test_the_parents_secret_is_out_of_reach(tmp_path: Path) -> None:
    """Every /proc/PID/environ and cmdline the child can see, its parents' included."""
    attack = f"""
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for part in ("environ", "cmdline"):
        try:
            if {SECRET!r}.encode() in open(f"/proc/{{pid}}/{{part}}", "rb").read():
                return True
        except OSError:
            pass
return False
"""
    assert_held(tmp_path, attack)  # `kb check`, the child's parent, holds the secret from its exec


def test_no_listener_on_the_host_is_reachable(tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    heard: list[bytes] = []

    def serve() -> None:
        server.settimeout(0.5)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                heard.append(conn.recv(64))

    stop = threading.Event()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    attack = f"""
s = socket.create_connection(("127.0.0.1", {port}), timeout=2)
s.sendall(b"exfiltrated")
s.close()
return True
"""
    try:
        held = check(tmp_path, attack)
        assert held["passed"] is True and not heard, (held, heard)
        loose = check(tmp_path, attack, "none")
        time.sleep(0.5)
        # once per seed: the candidate's child runs every draw before the judge compares
        assert loose["passed"] is False and heard == [b"exfiltrated"] * 3, (loose, heard)
    finally:
        stop.set()
        thread.join()
        server.close()


def test_the_log_cannot_be_read_or_written(tmp_path: Path) -> None:
    """A recorded run's database, found at a known path: no byte read, no row inserted, still replays."""
    db = tmp_path / "kernelbrain.db"
    shutil.copy(FIXTURE_DB, db)

    def events() -> int:
        with sqlite3.connect(db) as con:  # WAL mode: an insert lands in the -wal file first
            return con.execute("SELECT count(*) FROM events").fetchone()[0]

    before = events()
    attack = f"""
escaped = {b"SQLite format 3"!r} in open({str(db)!r}, "rb").read(100)
con = sqlite3.connect({str(db)!r})
con.execute("INSERT INTO events (run_id, type, version, key, payload, actor, ts) "
            "VALUES ('r', 'RunFinished', 1, 'forged', '{{}}', 'cand', 0)")
con.commit()
return escaped
"""
    held = check(tmp_path, attack)
    assert held["passed"] is True, held
    assert events() == before, "the candidate changed the database"
    run_id = json.loads(kb("ls", "--db", str(db), "--json").stdout)[0]["run_id"]
    replayed = kb("replay", run_id, "--db", str(db))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    loose = check(tmp_path, attack, "none")
    assert loose["passed"] is False and events() == before + 1, "the attack is not real"


def test_the_hosts_users_and_files_are_hidden(tmp_path: Path) -> None:
    """The host's users and password hashes, and the files beside kb's own source (a checkout's
    database, its tests) are not there to read."""
    attack = f"""
users = open("/etc/passwd").read()
try:
    hashes = open("/etc/shadow").read()
except OSError:
    hashes = ""
return "root:" in users or bool(hashes) or os.path.exists({str(FIXTURE_DB)!r})
"""
    assert_held(tmp_path, attack)


def test_a_detached_grandchild_dies_with_the_sandbox(tmp_path: Path) -> None:
    """A `setsid` process the candidate starts fails its gate and outlives neither its child nor
    `kb check`."""
    token = f"kb-red-team-orphan-{os.getpid()}-{time.monotonic_ns()}"
    attack = f"""
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", {token!r}], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
return False
"""

    def survivors() -> list[int]:
        found = []
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                if token.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                pass
        return found

    held = check(tmp_path, attack)
    # a process left running after its call could rewrite the outputs the judge reads: the gate fails it
    assert held["passed"] is False and held["category"] == "policy", held
    assert "a process it started" in held["detail"], held
    time.sleep(0.5)
    assert survivors() == [], "a candidate's detached process outlived its sandbox"
    check(tmp_path, attack, "none")  # without namespaces it does outlive kb check: the attack is real
    time.sleep(0.5)
    loose = survivors()
    for pid in loose:
        os.kill(pid, 9)
    assert loose, "the detached process should survive without namespaces"


def test_the_judges_draws_are_read_only(tmp_path: Path) -> None:
    """The gate's inputs, drawn by the judge into a folder the candidate's child can see: it cannot write
    them (for the next candidates to be judged on its own inputs)."""
    attack = """
import glob, sys
frame = sys._getframe()  # its own gate's folder, from the trial's frame (not other tests' gates)
while "draws" not in frame.f_locals:
    frame = frame.f_back
written = False
for path in glob.glob(frame.f_locals["draws"].folder + "/*-inputs.pt"):
    try:
        with open(path, "r+b") as f:
            f.write(b"spoilt")
        written = True
    except OSError:
        pass
return written
"""
    held = check(tmp_path, attack)
    assert held["passed"] is True, f"the attack got out of the sandbox: {held}"
    loose = check(tmp_path, attack, "none")  # it spoils the files of the seeds after its first
    assert (loose["passed"], loose["category"]) == (False, "policy"), f"the attack is not real: {loose}"
    assert "no longer reads" in loose["detail"], loose
