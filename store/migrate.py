"""Migration runner: numbered `NNNN_name.sql` files, applied in order, each in ONE transaction.

A migration's statements and its `schema_migrations` row commit together or not at all, so a
failure leaves the database at the previous version with no partial tables. Listing is read-only.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from kernelbrain.store.driver import sqlite3
from kernelbrain.store.errors import ForeignDatabase, SchemaTooNew, StoreError

MIGRATIONS = "kernelbrain.store.migrations"  # the package the wheel installs migrations/ as
_FILE = re.compile(r"^(\d{4})_([A-Za-z0-9_]+)\.sql$")
COLUMNS = ("version", "name", "applied_at")  # what makes a schema_migrations table ours

CREATE_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
)
HAS_TABLE = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
TABLE_INFO = "SELECT name FROM pragma_table_info('schema_migrations')"
SELECT_APPLIED = "SELECT version, name FROM schema_migrations ORDER BY version"
IS_APPLIED = "SELECT 1 FROM schema_migrations WHERE version = ?"
RECORD = "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str  # file stem, e.g. "0001_events"
    sql: str


def discover(directory: str | Path | None = None, *, dialect: str = "sqlite") -> list[Migration]:
    """Migrations shipped in the store's `migrations` package (or in `directory`), sorted by number.

    SQLite's sit in the package itself, PostgreSQL's in its `postgres` folder (dialect="postgres")."""
    shipped = resources.files(MIGRATIONS)
    if dialect != "sqlite":
        shipped = shipped / dialect
    root: Traversable = shipped if directory is None else Path(directory)
    if not root.is_dir():
        raise StoreError(f"no migrations directory {root}; pass an existing migrations_dir")
    found: dict[int, Migration] = {}
    for entry in root.iterdir():
        m = _FILE.match(entry.name)
        if m is None:
            continue
        version = int(m.group(1))
        if version in found:
            raise StoreError(
                f"two migrations numbered {version:04d} in {root} ({found[version].name}, {entry.name});"
                " renumber one"
            )
        found[version] = Migration(version, entry.name[: -len(".sql")], entry.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]


def to_apply(
    where: str,
    kind: str,
    migrations: list[Migration],
    *,
    has_objects: bool,
    ours: bool | None,
    done: dict[int, str],
    readonly: bool,
) -> list[Migration]:
    """The migrations an opening store must apply, or the StoreError that refuses the database.

    where: the store's printable location; kind: "SQLite" or "PostgreSQL"; has_objects: whether the
    database holds any table; ours/done: is_ours() and applied() as read from it."""
    if ours is False or (ours is None and has_objects):
        raise ForeignDatabase(f"{where} is a {kind} database but not a kb database; pass another --db")
    known = migrations[-1].version if migrations else 0
    if done and max(done) > known:
        raise SchemaTooNew(
            f"{where} was written by a newer kb (schema {max(done)}, this kb knows {known});"
            " upgrade kernelbrain to open it"
        )
    todo = [m for m in migrations if m.version not in done]
    if readonly:
        if not has_objects:
            raise StoreError(f"{where} is an empty database: nothing has been recorded in it")
        if todo:
            names = ", ".join(m.name for m in todo)
            raise StoreError(
                f"{where} needs migrations {names} and is opened read-only;"
                " open it once without read-only to upgrade it"
            )
        return []
    return todo


def is_ours(conn: sqlite3.Connection) -> bool | None:
    """None: no schema_migrations table; True/False: whether it has our columns (read-only)."""
    if conn.execute(HAS_TABLE).fetchone() is None:
        return None
    return set(COLUMNS) <= {row[0] for row in conn.execute(TABLE_INFO)}


def applied(conn: sqlite3.Connection) -> dict[int, str]:
    """{version: name} of recorded migrations; empty when none ran yet (read-only)."""
    if conn.execute(HAS_TABLE).fetchone() is None:
        return {}
    return dict(conn.execute(SELECT_APPLIED).fetchall())


def pending(conn: sqlite3.Connection, migrations: list[Migration]) -> list[Migration]:
    done = applied(conn)
    return [m for m in migrations if m.version not in done]


def split_statements(sql: str) -> list[str]:
    """Split a script into single statements; complete_statement knows trigger bodies and quotes.

    We cannot use executescript: it COMMITs any open transaction first, which would break the
    one-transaction-per-migration rule.
    """
    statements: list[str] = []
    buf = ""
    parts = sql.split(";")
    for i, part in enumerate(parts):
        buf += part
        if i == len(parts) - 1:
            break
        buf += ";"
        if sqlite3.complete_statement(buf):
            statements.append(buf.strip())
            buf = ""
    if buf.strip():
        statements.append(buf.strip())  # a last statement without ';' (or a trailing comment)
    return statements


def apply(conn: sqlite3.Connection, migration: Migration) -> bool:
    """Apply one migration and record it atomically; False if another connection already did."""
    statements = split_statements(migration.sql)
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(CREATE_TABLE)
        # Re-checked under the write lock: several processes may open a fresh file at once.
        if conn.execute(IS_APPLIED, (migration.version,)).fetchone() is not None:
            conn.execute("ROLLBACK")
            return False
        for statement in statements:
            conn.execute(statement)
        conn.execute(RECORD, (migration.version, migration.name, time.time()))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return True
