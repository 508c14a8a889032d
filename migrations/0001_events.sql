-- 0001: the append-only event log, content-addressed blobs, task leases and tracking cursors.
-- Applied inside one BEGIN IMMEDIATE transaction by store/migrate.py, together with its
-- schema_migrations row; do not put BEGIN/COMMIT here.

CREATE TABLE events (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,  -- AUTOINCREMENT: a seq is never reused
    run_id  TEXT    NOT NULL,
    type    TEXT    NOT NULL,
    version INTEGER NOT NULL,                   -- payload schema version of this event type
    subject TEXT,                               -- e.g. candidate id, where the event has one
    stage   INTEGER,                            -- e.g. ladder rung, where the event has one
    key     TEXT    NOT NULL UNIQUE,            -- idempotency key: a second append is a no-op
    payload BLOB    NOT NULL,                   -- orjson-encoded JSON object
    actor   TEXT    NOT NULL,                   -- worker id that wrote it
    ts      REAL    NOT NULL                    -- wall time, seconds since the epoch
);
CREATE INDEX events_run_seq ON events (run_id, seq);
CREATE INDEX events_type ON events (type);

-- The log is append-only: the database itself refuses to rewrite history.
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are append-only');
END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are append-only');
END;
-- INSERT OR REPLACE deletes the old row without firing the DELETE trigger (recursive_triggers is
-- off by default), so an insert that collides with an existing seq or key is refused as well.
CREATE TRIGGER events_no_replace BEFORE INSERT ON events
WHEN EXISTS (SELECT 1 FROM events WHERE seq = NEW.seq OR key = NEW.key)
BEGIN
    SELECT RAISE(ABORT, 'events are append-only');
END;

CREATE TABLE blobs (
    hash TEXT    PRIMARY KEY,                   -- sha256 hex of data
    data BLOB    NOT NULL,
    size INTEGER NOT NULL
);
-- A hash names its content forever; changing or dropping a blob would break every event citing it.
CREATE TRIGGER blobs_no_update BEFORE UPDATE ON blobs
BEGIN
    SELECT RAISE(ABORT, 'blobs are immutable');
END;
CREATE TRIGGER blobs_no_delete BEFORE DELETE ON blobs
BEGIN
    SELECT RAISE(ABORT, 'blobs are immutable');
END;
CREATE TRIGGER blobs_no_replace BEFORE INSERT ON blobs
WHEN EXISTS (SELECT 1 FROM blobs WHERE hash = NEW.hash)
BEGIN
    SELECT RAISE(ABORT, 'blobs are immutable');
END;

-- One row per task ever claimed. token only grows (fencing); done = 1 is final.
CREATE TABLE leases (
    task     TEXT    PRIMARY KEY,
    owner    TEXT    NOT NULL,
    token    INTEGER NOT NULL,
    deadline REAL    NOT NULL,
    done     INTEGER NOT NULL DEFAULT 0
);

-- Tracking positions of followers, written in the same transaction as their outputs.
CREATE TABLE cursors (
    name     TEXT    PRIMARY KEY,
    position INTEGER NOT NULL
);
