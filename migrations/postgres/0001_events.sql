-- 0001 (PostgreSQL): the append-only event log, content-addressed blobs, task leases and tracking
-- cursors; the same tables as ../0001_events.sql. Applied inside one transaction by
-- store/postgres.py, together with its schema_migrations row; do not put BEGIN/COMMIT here.

CREATE TABLE events (
    -- assigned by the store under its append lock (max + 1, ...), not by a sequence: a sequence
    -- leaves gaps on rollback and hands out numbers in an order other than commit order
    seq     BIGINT           PRIMARY KEY,
    run_id  TEXT             NOT NULL,
    type    TEXT             NOT NULL,
    version INTEGER          NOT NULL,       -- payload schema version of this event type
    subject TEXT,                            -- e.g. candidate id, where the event has one
    stage   INTEGER,                         -- e.g. ladder rung, where the event has one
    key     TEXT             NOT NULL UNIQUE, -- idempotency key: a second append is a no-op
    payload BYTEA            NOT NULL,       -- orjson-encoded JSON object, byte for byte as written
    actor   TEXT             NOT NULL,       -- worker id that wrote it
    ts      DOUBLE PRECISION NOT NULL        -- wall time, seconds since the epoch
);
CREATE INDEX events_run_seq ON events (run_id, seq);
CREATE INDEX events_type ON events (type);

-- The log is append-only: the database itself refuses to rewrite history. INSERT ... ON CONFLICT
-- DO UPDATE fires the UPDATE trigger, so it is refused too.
CREATE FUNCTION kb_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%', TG_ARGV[0] USING ERRCODE = 'integrity_constraint_violation';
END
$$;
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    FOR EACH ROW EXECUTE FUNCTION kb_refuse('events are append-only');
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION kb_refuse('events are append-only');
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION kb_refuse('events are append-only');

-- Waiting readers LISTEN on kb_events (store/postgres.py, NOTIFY_CHANNEL); one notification per
-- inserting statement, delivered when its transaction commits.
CREATE FUNCTION kb_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('kb_events', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER events_notify AFTER INSERT ON events
    FOR EACH STATEMENT EXECUTE FUNCTION kb_events_notify();

CREATE TABLE blobs (
    hash TEXT    PRIMARY KEY,                -- sha256 hex of data
    data BYTEA   NOT NULL,
    size INTEGER NOT NULL
);
-- A hash names its content forever; changing or dropping a blob would break every event citing it.
CREATE TRIGGER blobs_no_update BEFORE UPDATE ON blobs
    FOR EACH ROW EXECUTE FUNCTION kb_refuse('blobs are immutable');
CREATE TRIGGER blobs_no_delete BEFORE DELETE ON blobs
    FOR EACH ROW EXECUTE FUNCTION kb_refuse('blobs are immutable');
CREATE TRIGGER blobs_no_truncate BEFORE TRUNCATE ON blobs
    FOR EACH STATEMENT EXECUTE FUNCTION kb_refuse('blobs are immutable');

-- One row per task ever claimed. token only grows (fencing); done = true is final.
CREATE TABLE leases (
    task     TEXT             PRIMARY KEY,
    owner    TEXT             NOT NULL,
    token    BIGINT           NOT NULL,
    deadline DOUBLE PRECISION NOT NULL,
    done     BOOLEAN          NOT NULL DEFAULT false
);

-- Tracking positions of followers, written in the same transaction as their outputs.
CREATE TABLE cursors (
    name     TEXT   PRIMARY KEY,
    position BIGINT NOT NULL
);
