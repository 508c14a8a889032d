"""A real, throw-away PostgreSQL server for the tests (and benchmarks/store_bench.py): initdb and pg_ctl in
a temporary folder, listening on a free port on 127.0.0.1 only, with password authentication.

initdb and postgres refuse to run as root. Where this process is root (CI, this machine), the server runs
as an unprivileged account through subprocess's user=/group= (no sudo, no su): `postgres` where the
distribution's package created it, else `nobody`. Its folder is created by us and handed to that account.

Binaries: $KB_PG_BIN if set, else initdb on the PATH, else the newest /usr/lib/postgresql/*/bin (Debian's
package puts them there). Where there are none, a test that needs the server is skipped (tests/needs.py;
under CI it fails). Anything else that goes wrong raises PgServerError with the server's log: the test
fails, it does not skip.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg

SUPERUSER = "kb"


class PgServerError(RuntimeError):
    """The test server could not be set up; the message says why (with its log's tail)."""


def bin_dir() -> Path:
    if os.environ.get("KB_PG_BIN"):
        return Path(os.environ["KB_PG_BIN"])
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if versions:
        return Path(versions[-1]).parent
    raise PgServerError(
        "no PostgreSQL server binaries (initdb, pg_ctl): install the server (Debian: apt install postgresql)"
        " or set KB_PG_BIN to their folder"
    )


def _account() -> pwd.struct_passwd | None:
    """The account the server runs as: None (this one) unless this process is root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise PgServerError(
        "running as root and neither a `postgres` nor a `nobody` account exists to run the server"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """One server: start() it, make databases with new_database(), stop() it (removes its folder)."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.bin = bin_dir()
        self.account = _account()
        self.dir = Path(tempfile.mkdtemp(prefix="kb-pg-"))  # /tmp, which the server's account can reach
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.password = secrets.token_urlsafe(16)
        self.port = 0
        # durability is not under test: without fsync a test database costs milliseconds
        self.settings = {
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            **(settings or {}),
        }
        self._count = 0

    def _run(self, *cmd: str, timeout: float = 120) -> None:
        kw: dict[str, Any] = {}
        if self.account is not None:
            kw = {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        done = subprocess.run(
            cmd, cwd=self.dir, env=env, capture_output=True, text=True, timeout=timeout, check=False, **kw
        )
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            said = done.stderr.strip() or done.stdout.strip()
            raise PgServerError(f"{' '.join(cmd[:2])} failed ({done.returncode}): {said}\n{log}")

    def start(self) -> PgServer:
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        if self.account is not None:
            for p in (self.dir, pwfile):
                os.chown(p, self.account.pw_uid, self.account.pw_gid)
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", SUPERUSER, f"--pwfile={pwfile}",
            "--auth=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip
        pwfile.unlink()
        options = " ".join(f"-c {k}={v}" for k, v in self.settings.items())
        for _ in range(3):  # a free port can be taken between free_port() and the server's bind
            self.port = free_port()
            opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 {options}"
            try:
                self._run(
                    str(self.bin / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-w",
                    "-o",
                    opts,
                    "start",
                )
                break
            except PgServerError:
                if "already in use" not in self.log.read_text(errors="replace"):
                    raise
        else:
            raise PgServerError(f"no free port for the test server after 3 tries; see {self.log}")
        return self

    def url(self, database: str = "postgres", *, password: bool = True) -> str:
        secret = f":{self.password}" if password else ""
        return f"postgresql://{SUPERUSER}{secret}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL (with the password in it)."""
        self._count += 1
        name = f"kb_test_{os.getpid()}_{self._count}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def restart(self) -> None:
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-m", "fast", "restart"
        )

    def stop(self) -> None:
        if self.data.exists():
            with contextlib.suppress(PgServerError, subprocess.TimeoutExpired):
                self._run(
                    str(self.bin / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-w",
                    "-m",
                    "immediate",
                    "stop",
                    timeout=60,
                )
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
