"""kb on a PostgreSQL store, selected by a --db URL or KB_DB: a whole run through the real CLI with its
workers as separate processes, the commands that read it back, `kb doctor --db`, and the password kept
out of every output and every sandboxed child's environment."""

from __future__ import annotations

import json

from kernelbrain.store import open_store
from kernelbrain.store.postgres import PostgresStore

from kernelbrain.runtime.environment import child_env_allowed, without_secrets
from tests.kbcli import SOFTMAX, kb, kb_env


def test_a_run_on_postgres_end_to_end(pg_server, pg_url: str) -> None:
    secret = pg_server.password
    r = kb("run", str(SOFTMAX), "--db", pg_url, "--max-candidates", "2", "--device", "cpu", timeout=900)
    assert r.returncode == 0, r.stderr
    assert secret not in r.stdout + r.stderr
    run_id = r.stdout.split()[1]
    with open_store(pg_url) as store:
        assert isinstance(store, PostgresStore) and store.run_ids() == [run_id]
        actors = {e.actor for e in store.read(run_id=run_id)}
    roles = {a.split("@")[0] for a in actors if "@" in a}
    assert roles == {"generator", "gatekeeper", "benchmarker", "profiler", "scheduler"}
    # one worker process on a CPU, stepping every role
    assert len({a.split(":")[1] for a in actors if "@" in a}) == 1
    # the password through PGPASSWORD and the database through KB_DB work the same
    env = kb_env(KB_DB=pg_server.url(pg_url.rsplit("/", 1)[1], password=False), PGPASSWORD=secret)
    for args in (["replay", run_id], ["ls"], ["status", run_id]):
        out = kb(*args, env=env)
        assert out.returncode == 0, (args, out.stderr)
        assert secret not in out.stdout + out.stderr
    assert "agree with policy" in kb("replay", run_id, env=env).stdout


def test_errors_print_the_url_masked(pg_server, pg_url: str) -> None:
    wrong = pg_url.replace(pg_server.password, "hunter2-not-it")
    r = kb("ls", "--db", wrong)
    assert r.returncode == 1
    assert r.stderr.startswith("Error: cannot reach the PostgreSQL server at postgresql://kb:***@127.0.0.1")
    assert "hunter2-not-it" not in r.stdout + r.stderr
    open_store(pg_url).close()  # the schema, no run
    empty = kb("ls", "--db", pg_url)
    assert empty.returncode == 0 and empty.stdout.startswith("no runs in postgresql://kb:***@127.0.0.1")
    assert pg_server.password not in empty.stdout + empty.stderr


def test_doctor_checks_the_server_and_the_schema(pg_server, pg_url: str) -> None:
    def store_check(url: str) -> tuple[int, dict]:
        r = kb("doctor", "--json", "--db", url, env=kb_env(KB_SANDBOX="none"))
        assert pg_server.password not in r.stdout + r.stderr
        checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
        return r.returncode, checks["store"]

    _, fresh = store_check(pg_url)  # an empty database: kb run creates the schema
    assert fresh["status"] == "warn" and "empty database" in fresh["detail"]
    assert fresh["facts"]["server_version"].startswith("15") or fresh["facts"]["server_version"][:2].isdigit()
    open_store(pg_url).close()
    _, current = store_check(pg_url)
    assert current["status"] == "ok" and "kb schema 1, current" in current["detail"]
    assert current["detail"].startswith(
        f"PostgreSQL {current['facts']['server_version']} at postgresql://kb:***@"
    )
    code, down = store_check(pg_url.replace(pg_server.password, "wrong"))
    assert code == 1 and down["status"] == "fail" and "cannot reach the PostgreSQL server" in down["detail"]


def test_store_secrets_reach_workers_but_never_a_sandboxed_child() -> None:
    env = {"PGPASSWORD": "pw", "KB_DB": "postgresql://kb:pw@h/db", "KB_LLM_API_KEY": "k", "PATH": "/bin"}
    assert without_secrets(env) == {"PGPASSWORD": "pw", "KB_DB": "postgresql://kb:pw@h/db", "PATH": "/bin"}
    assert [k for k in env if child_env_allowed(k)] == ["PATH"]
