//! Versioned schema migrations, applied at start in order, each in its own transaction;
//! SQLite's `PRAGMA user_version` and PostgreSQL's `schema_version` table record how far
//! a database has come.

use rusqlite::{Connection, TransactionBehavior};

use super::{Result, StoreError};

/// Migration N (1-based) brings a database from version N-1 to N. Never edit a shipped
/// migration: add a new one.
const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    "
    CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) STRICT;

    CREATE TABLE workspaces (
        name           TEXT PRIMARY KEY,
        revision       INTEGER NOT NULL,
        history_floor  INTEGER NOT NULL,  -- deltas from revisions below this are incomplete
        counters_dirty INTEGER NOT NULL,  -- reinforcements waiting to be published
        created_at     TEXT NOT NULL
    ) STRICT;

    CREATE TABLE objects (
        workspace   TEXT NOT NULL REFERENCES workspaces(name),
        sha256      TEXT NOT NULL,
        body        BLOB NOT NULL,
        released_at TEXT,                 -- when the last card stopped using it
        PRIMARY KEY (workspace, sha256)
    ) STRICT, WITHOUT ROWID;

    CREATE TABLE cards (
        workspace          TEXT NOT NULL REFERENCES workspaces(name),
        id                 TEXT NOT NULL,
        card_type          TEXT NOT NULL,
        title_key          TEXT NOT NULL, -- case- and space-folded title, for store dedup
        summary            TEXT NOT NULL, -- CardSummary as JSON, for manifests
        sha256             TEXT NOT NULL,
        size               INTEGER NOT NULL,
        occurrence         INTEGER NOT NULL,
        last_seen          TEXT,
        pending_occurrence INTEGER NOT NULL DEFAULT 0,
        pending_last_seen  TEXT,
        live               INTEGER NOT NULL, -- enabled, not superseded, not archived
        archived_at        TEXT,
        rev                INTEGER NOT NULL, -- revision of the last change the manifest shows
        created_at         TEXT NOT NULL,
        PRIMARY KEY (workspace, id),
        FOREIGN KEY (workspace, sha256) REFERENCES objects(workspace, sha256)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX cards_by_rev ON cards (workspace, rev);
    CREATE INDEX cards_by_title ON cards (workspace, card_type, title_key);
    CREATE INDEX cards_by_sha ON cards (workspace, sha256);

    CREATE TABLE tombstones (
        workspace  TEXT NOT NULL,
        id         TEXT NOT NULL,
        rev        INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (workspace, id)
    ) STRICT;

    CREATE TABLE tokens (
        id         TEXT PRIMARY KEY,
        hash       TEXT NOT NULL UNIQUE,     -- SHA-256 of the whole token; the token is never stored
        role       TEXT NOT NULL CHECK (role IN ('node', 'admin')),
        workspaces TEXT NOT NULL,            -- JSON array
        note       TEXT,
        created_at TEXT NOT NULL,
        revoked_at TEXT
    ) STRICT;

    CREATE TABLE history (
        seq           INTEGER PRIMARY KEY AUTOINCREMENT,
        workspace     TEXT NOT NULL,
        card_id       TEXT,
        revision      INTEGER NOT NULL,
        at            TEXT NOT NULL,
        actor         TEXT NOT NULL,
        action        TEXT NOT NULL,
        sha256_before TEXT,
        sha256_after  TEXT,
        content       TEXT,                  -- card text after the change; NULL once redacted
        redacted      INTEGER NOT NULL DEFAULT 0,
        detail        TEXT
    ) STRICT;
    CREATE INDEX history_by_card ON history (workspace, card_id);
    ",
    // 2: bounds on agent stores: stores counted per (node token, task), and at most one
    // reinforcement per (node token, task, card).
    "
    CREATE TABLE task_stores (
        workspace TEXT NOT NULL,
        actor     TEXT NOT NULL,
        task_id   TEXT NOT NULL,
        stores    INTEGER NOT NULL,
        last_at   TEXT NOT NULL,
        PRIMARY KEY (workspace, actor, task_id)
    ) STRICT, WITHOUT ROWID;

    CREATE TABLE task_reinforcements (
        workspace TEXT NOT NULL,
        actor     TEXT NOT NULL,
        task_id   TEXT NOT NULL,
        card_id   TEXT NOT NULL,
        at        TEXT NOT NULL,
        PRIMARY KEY (workspace, actor, task_id, card_id)
    ) STRICT, WITHOUT ROWID;
    ",
    // 3: the curation loop. Tokens get a person's name, an expiry and their last use;
    // receipts of tasks (one row per task, to count each once) become per-card usage
    // counters per day, the hosts that saw a card, and when a task last named an asset.
    "
    ALTER TABLE tokens ADD COLUMN name TEXT;
    ALTER TABLE tokens ADD COLUMN expires_at TEXT;
    ALTER TABLE tokens ADD COLUMN last_used_at TEXT;

    CREATE TABLE receipts (
        workspace   TEXT NOT NULL,
        task_id     TEXT NOT NULL,
        prepared_at TEXT NOT NULL,
        actor       TEXT NOT NULL,         -- the node token that reported it
        host        TEXT NOT NULL,
        received_at TEXT NOT NULL,
        PRIMARY KEY (workspace, task_id, prepared_at)
    ) STRICT, WITHOUT ROWID;

    CREATE TABLE card_usage_days (
        workspace TEXT NOT NULL,
        card_id   TEXT NOT NULL,
        day       TEXT NOT NULL,           -- YYYY-MM-DD (UTC) of the task's prepare
        delivered INTEGER NOT NULL,        -- tasks it was delivered to
        retrieved INTEGER NOT NULL,        -- tasks whose retrieves returned it
        PRIMARY KEY (workspace, card_id, day)
    ) STRICT, WITHOUT ROWID;

    CREATE TABLE card_usage (
        workspace         TEXT NOT NULL,
        card_id           TEXT NOT NULL,
        last_delivered_at TEXT,
        PRIMARY KEY (workspace, card_id)
    ) STRICT, WITHOUT ROWID;

    CREATE TABLE card_hosts (
        workspace TEXT NOT NULL,
        card_id   TEXT NOT NULL,
        host      TEXT NOT NULL,
        last_at   TEXT NOT NULL,
        PRIMARY KEY (workspace, card_id, host)
    ) STRICT, WITHOUT ROWID;

    CREATE TABLE asset_usage (
        workspace     TEXT NOT NULL,
        asset_id      TEXT NOT NULL,
        last_named_at TEXT NOT NULL,
        PRIMARY KEY (workspace, asset_id)
    ) STRICT, WITHOUT ROWID;
    ",
    // 4: the write path at fleet scale. Per card, what intake derived from its text: the
    // same-lesson fingerprint (normalised-text hash, MinHash signature, word count, band
    // keys) and the credentials found in it; duplicate groups; rejection tombstones (a
    // fingerprint and the curator's reason, never text); and each store's first answer by
    // its idempotency key.
    "
    CREATE TABLE card_intake (
        workspace   TEXT NOT NULL,
        card_id     TEXT NOT NULL,
        sha256      TEXT NOT NULL,          -- the object these facts were made from
        version     TEXT NOT NULL,          -- fingerprint and rule versions; others are made again
        exact       TEXT NOT NULL,          -- SHA-256 of the normalised title and body
        signature   BLOB NOT NULL,          -- MinHash minima, little-endian u32s
        words       INTEGER NOT NULL,
        numbers     BLOB NOT NULL,          -- hashes of its words with digits, little-endian u64s
        vector      BLOB,                   -- its embedding (one i8 a dimension), with a model
        credentials TEXT,                   -- JSON findings (kind, field, line, column); NULL: none
        PRIMARY KEY (workspace, card_id)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX card_intake_by_exact ON card_intake (workspace, exact);

    CREATE TABLE lesson_bands (
        workspace TEXT NOT NULL,
        band      INTEGER NOT NULL,
        card_id   TEXT NOT NULL,
        PRIMARY KEY (workspace, band, card_id)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX lesson_bands_by_card ON lesson_bands (workspace, card_id);

    CREATE TABLE duplicate_groups (
        workspace TEXT NOT NULL,
        card_id   TEXT NOT NULL,
        group_id  TEXT NOT NULL,            -- the group's first card
        at        TEXT NOT NULL,
        PRIMARY KEY (workspace, card_id)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX duplicate_groups_by_group ON duplicate_groups (workspace, group_id);

    CREATE TABLE rejections (
        workspace TEXT NOT NULL,
        id        TEXT NOT NULL,
        card_id   TEXT NOT NULL,            -- the rejected card (purged later; this stays)
        exact     TEXT NOT NULL,
        signature BLOB NOT NULL,
        words     INTEGER NOT NULL,
        numbers   BLOB NOT NULL,
        vector    BLOB,
        scope     TEXT NOT NULL,            -- who could see the rejected card (JSON): whom a refusal may name it to
        reason    TEXT NOT NULL,
        actor     TEXT NOT NULL,
        at        TEXT NOT NULL,
        lifted_at TEXT,
        lifted_by TEXT,
        PRIMARY KEY (workspace, id)
    ) STRICT, WITHOUT ROWID;

    CREATE TABLE store_answers (
        workspace TEXT NOT NULL,
        actor     TEXT NOT NULL,
        key       TEXT NOT NULL,
        task_id   TEXT NOT NULL,            -- the store's task: the key is its, and no other's
        answer    TEXT NOT NULL,            -- the first answer, as JSON
        at        TEXT NOT NULL,
        PRIMARY KEY (workspace, actor, key)
    ) STRICT, WITHOUT ROWID;
    ",
    // 5: curators at fleet scale. A card waits for review while it is live and unverified;
    // the flag is kept per row, so the queue's size and age are read from an index
    // instead of every card's summary.
    "
    ALTER TABLE cards ADD COLUMN awaiting INTEGER NOT NULL DEFAULT 0;
    UPDATE cards SET awaiting = 1
     WHERE live = 1 AND json_extract(summary, '$.trust') = 'unverified';
    CREATE INDEX cards_awaiting ON cards (workspace, awaiting, created_at);
    ",
    // 6: curation reads by index, per row: the card that replaced each card (merged or
    // superseded), so a card's details list what it replaced and the staleness report
    // follows chains; and when each card was made (its own `created_at`, else when the
    // server first had it), so the staleness report and the queue read old cards by range.
    "
    ALTER TABLE cards ADD COLUMN superseded_by TEXT;
    ALTER TABLE cards ADD COLUMN made_at TEXT;
    UPDATE cards SET superseded_by = json_extract(summary, '$.superseded_by'),
                     made_at = COALESCE(json_extract(summary, '$.created_at'), created_at);
    CREATE INDEX cards_superseded_by ON cards (workspace, superseded_by);
    CREATE INDEX cards_made ON cards (workspace, live, made_at);
    ",
    // 7: alerts for the curators. Each event (a new duplicate group in the queue, an item
    // waiting past its age) is announced once per subject, its signed body kept until the
    // webhook took it, so a restart or an unreachable receiver loses none.
    "
    CREATE TABLE alerts (
        workspace    TEXT NOT NULL,
        kind         TEXT NOT NULL,
        subject      TEXT NOT NULL,
        body         TEXT NOT NULL,
        created_at   TEXT NOT NULL,
        attempts     INTEGER NOT NULL DEFAULT 0,
        next_at      TEXT NOT NULL,
        delivered_at TEXT,
        failed_at    TEXT,
        last_error   TEXT,
        PRIMARY KEY (workspace, kind, subject)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX alerts_due ON alerts (delivered_at, failed_at, next_at);
    ",
    // 8: what agents say of cards and how tasks ended. Deliveries per day are split by the
    // task's outcome (the rest of `delivered` is unknown); each task's verdict on a card is
    // a row, its note screened; a curator who keeps a flagged card clears its flag.
    "
    ALTER TABLE card_usage_days ADD COLUMN succeeded INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE card_usage_days ADD COLUMN failed INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE card_feedback (
        workspace   TEXT NOT NULL,
        card_id     TEXT NOT NULL,
        task_id     TEXT NOT NULL,
        prepared_at TEXT NOT NULL,
        verdict     TEXT NOT NULL,     -- helped, wrong or outdated
        user_id     TEXT,              -- the task's user
        host        TEXT NOT NULL,
        note        TEXT,
        at          TEXT NOT NULL,
        PRIMARY KEY (workspace, card_id, task_id, prepared_at)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX card_feedback_at ON card_feedback (workspace, at);
    CREATE TABLE card_flags (
        workspace  TEXT NOT NULL,
        card_id    TEXT NOT NULL,
        cleared_at TEXT NOT NULL,
        PRIMARY KEY (workspace, card_id)
    ) STRICT, WITHOUT ROWID;
    ",
];

/// The same schema for PostgreSQL, version for version: migration N here leaves the tables
/// migration N leaves in SQLite, spelled the PostgreSQL way. Integers are BIGINT (flags
/// too, so queries compare them with 0 and 1 on both engines), bytes are BYTEA, and text
/// sorts by byte ("C" collation) as SQLite's does, so both engines list cards in the same
/// order and give the same manifests. `changes` counts committed writes: replicas poll it.
pub(crate) const PG_MIGRATIONS: &[&str] = &[
    // 1
    r#"
    CREATE TABLE meta (
        key   TEXT COLLATE "C" PRIMARY KEY,
        value TEXT COLLATE "C" NOT NULL
    );

    CREATE TABLE changes (
        id BIGINT PRIMARY KEY CHECK (id = 1),
        n  BIGINT NOT NULL
    );
    INSERT INTO changes (id, n) VALUES (1, 0);

    CREATE TABLE workspaces (
        name           TEXT COLLATE "C" PRIMARY KEY,
        revision       BIGINT NOT NULL,
        history_floor  BIGINT NOT NULL,
        counters_dirty BIGINT NOT NULL,
        created_at     TEXT COLLATE "C" NOT NULL
    );

    CREATE TABLE objects (
        workspace   TEXT COLLATE "C" NOT NULL REFERENCES workspaces(name),
        sha256      TEXT COLLATE "C" NOT NULL,
        body        BYTEA NOT NULL,
        released_at TEXT COLLATE "C",
        PRIMARY KEY (workspace, sha256)
    );

    CREATE TABLE cards (
        workspace          TEXT COLLATE "C" NOT NULL REFERENCES workspaces(name),
        id                 TEXT COLLATE "C" NOT NULL,
        card_type          TEXT COLLATE "C" NOT NULL,
        title_key          TEXT COLLATE "C" NOT NULL,
        summary            TEXT COLLATE "C" NOT NULL,
        sha256             TEXT COLLATE "C" NOT NULL,
        size               BIGINT NOT NULL,
        occurrence         BIGINT NOT NULL,
        last_seen          TEXT COLLATE "C",
        pending_occurrence BIGINT NOT NULL DEFAULT 0,
        pending_last_seen  TEXT COLLATE "C",
        live               BIGINT NOT NULL,
        archived_at        TEXT COLLATE "C",
        rev                BIGINT NOT NULL,
        created_at         TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (workspace, id),
        FOREIGN KEY (workspace, sha256) REFERENCES objects(workspace, sha256)
    );
    CREATE INDEX cards_by_rev ON cards (workspace, rev);
    CREATE INDEX cards_by_title ON cards (workspace, card_type, title_key);
    CREATE INDEX cards_by_sha ON cards (workspace, sha256);

    CREATE TABLE tombstones (
        workspace  TEXT COLLATE "C" NOT NULL,
        id         TEXT COLLATE "C" NOT NULL,
        rev        BIGINT NOT NULL,
        created_at TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (workspace, id)
    );

    CREATE TABLE tokens (
        id         TEXT COLLATE "C" PRIMARY KEY,
        hash       TEXT COLLATE "C" NOT NULL UNIQUE,
        role       TEXT COLLATE "C" NOT NULL CHECK (role IN ('node', 'admin')),
        workspaces TEXT COLLATE "C" NOT NULL,
        note       TEXT COLLATE "C",
        created_at TEXT COLLATE "C" NOT NULL,
        revoked_at TEXT COLLATE "C"
    );

    CREATE TABLE history (
        seq           BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        workspace     TEXT COLLATE "C" NOT NULL,
        card_id       TEXT COLLATE "C",
        revision      BIGINT NOT NULL,
        at            TEXT COLLATE "C" NOT NULL,
        actor         TEXT COLLATE "C" NOT NULL,
        action        TEXT COLLATE "C" NOT NULL,
        sha256_before TEXT COLLATE "C",
        sha256_after  TEXT COLLATE "C",
        content       TEXT COLLATE "C",
        redacted      BIGINT NOT NULL DEFAULT 0,
        detail        TEXT COLLATE "C"
    );
    CREATE INDEX history_by_card ON history (workspace, card_id);
    "#,
    // 2
    r#"
    CREATE TABLE task_stores (
        workspace TEXT COLLATE "C" NOT NULL,
        actor     TEXT COLLATE "C" NOT NULL,
        task_id   TEXT COLLATE "C" NOT NULL,
        stores    BIGINT NOT NULL,
        last_at   TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (workspace, actor, task_id)
    );

    CREATE TABLE task_reinforcements (
        workspace TEXT COLLATE "C" NOT NULL,
        actor     TEXT COLLATE "C" NOT NULL,
        task_id   TEXT COLLATE "C" NOT NULL,
        card_id   TEXT COLLATE "C" NOT NULL,
        at        TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (workspace, actor, task_id, card_id)
    );
    "#,
    // 3
    r#"
    ALTER TABLE tokens ADD COLUMN name TEXT COLLATE "C";
    ALTER TABLE tokens ADD COLUMN expires_at TEXT COLLATE "C";
    ALTER TABLE tokens ADD COLUMN last_used_at TEXT COLLATE "C";

    CREATE TABLE receipts (
        workspace   TEXT COLLATE "C" NOT NULL,
        task_id     TEXT COLLATE "C" NOT NULL,
        prepared_at TEXT COLLATE "C" NOT NULL,
        actor       TEXT COLLATE "C" NOT NULL,
        host        TEXT COLLATE "C" NOT NULL,
        received_at TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (workspace, task_id, prepared_at)
    );

    CREATE TABLE card_usage_days (
        workspace TEXT COLLATE "C" NOT NULL,
        card_id   TEXT COLLATE "C" NOT NULL,
        day       TEXT COLLATE "C" NOT NULL,
        delivered BIGINT NOT NULL,
        retrieved BIGINT NOT NULL,
        PRIMARY KEY (workspace, card_id, day)
    );

    CREATE TABLE card_usage (
        workspace         TEXT COLLATE "C" NOT NULL,
        card_id           TEXT COLLATE "C" NOT NULL,
        last_delivered_at TEXT COLLATE "C",
        PRIMARY KEY (workspace, card_id)
    );

    CREATE TABLE card_hosts (
        workspace TEXT COLLATE "C" NOT NULL,
        card_id   TEXT COLLATE "C" NOT NULL,
        host      TEXT COLLATE "C" NOT NULL,
        last_at   TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (workspace, card_id, host)
    );

    CREATE TABLE asset_usage (
        workspace     TEXT COLLATE "C" NOT NULL,
        asset_id      TEXT COLLATE "C" NOT NULL,
        last_named_at TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (workspace, asset_id)
    );
    "#,
    // 4
    r#"
    CREATE TABLE card_intake (
        workspace   TEXT COLLATE "C" NOT NULL,
        card_id     TEXT COLLATE "C" NOT NULL,
        sha256      TEXT COLLATE "C" NOT NULL,
        version     TEXT COLLATE "C" NOT NULL,
        exact       TEXT COLLATE "C" NOT NULL,
        signature   BYTEA NOT NULL,
        words       BIGINT NOT NULL,
        numbers     BYTEA NOT NULL,
        vector      BYTEA,
        credentials TEXT COLLATE "C",
        PRIMARY KEY (workspace, card_id)
    );
    CREATE INDEX card_intake_by_exact ON card_intake (workspace, exact);

    CREATE TABLE lesson_bands (
        workspace TEXT COLLATE "C" NOT NULL,
        band      BIGINT NOT NULL,
        card_id   TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (workspace, band, card_id)
    );
    CREATE INDEX lesson_bands_by_card ON lesson_bands (workspace, card_id);

    CREATE TABLE duplicate_groups (
        workspace TEXT COLLATE "C" NOT NULL,
        card_id   TEXT COLLATE "C" NOT NULL,
        group_id  TEXT COLLATE "C" NOT NULL,
        at        TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (workspace, card_id)
    );
    CREATE INDEX duplicate_groups_by_group ON duplicate_groups (workspace, group_id);

    CREATE TABLE rejections (
        workspace TEXT COLLATE "C" NOT NULL,
        id        TEXT COLLATE "C" NOT NULL,
        card_id   TEXT COLLATE "C" NOT NULL,
        exact     TEXT COLLATE "C" NOT NULL,
        signature BYTEA NOT NULL,
        words     BIGINT NOT NULL,
        numbers   BYTEA NOT NULL,
        vector    BYTEA,
        scope     TEXT COLLATE "C" NOT NULL,
        reason    TEXT COLLATE "C" NOT NULL,
        actor     TEXT COLLATE "C" NOT NULL,
        at        TEXT COLLATE "C" NOT NULL,
        lifted_at TEXT COLLATE "C",
        lifted_by TEXT COLLATE "C",
        PRIMARY KEY (workspace, id)
    );

    CREATE TABLE store_answers (
        workspace TEXT COLLATE "C" NOT NULL,
        actor     TEXT COLLATE "C" NOT NULL,
        key       TEXT COLLATE "C" NOT NULL,
        task_id   TEXT COLLATE "C" NOT NULL,
        answer    TEXT COLLATE "C" NOT NULL,
        at        TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (workspace, actor, key)
    );
    "#,
    // 5
    r#"
    ALTER TABLE cards ADD COLUMN awaiting BIGINT NOT NULL DEFAULT 0;
    UPDATE cards SET awaiting = 1
     WHERE live = 1 AND (summary::jsonb ->> 'trust') = 'unverified';
    CREATE INDEX cards_awaiting ON cards (workspace, awaiting, created_at);
    "#,
    // 6
    r#"
    ALTER TABLE cards ADD COLUMN superseded_by TEXT COLLATE "C";
    ALTER TABLE cards ADD COLUMN made_at TEXT COLLATE "C";
    UPDATE cards SET superseded_by = summary::jsonb ->> 'superseded_by',
                     made_at = COALESCE(summary::jsonb ->> 'created_at', created_at);
    CREATE INDEX cards_superseded_by ON cards (workspace, superseded_by);
    CREATE INDEX cards_made ON cards (workspace, live, made_at);
    "#,
    // 7
    r#"
    CREATE TABLE alerts (
        workspace    TEXT COLLATE "C" NOT NULL,
        kind         TEXT COLLATE "C" NOT NULL,
        subject      TEXT COLLATE "C" NOT NULL,
        body         TEXT NOT NULL,
        created_at   TEXT COLLATE "C" NOT NULL,
        attempts     BIGINT NOT NULL DEFAULT 0,
        next_at      TEXT COLLATE "C" NOT NULL,
        delivered_at TEXT COLLATE "C",
        failed_at    TEXT COLLATE "C",
        last_error   TEXT,
        PRIMARY KEY (workspace, kind, subject)
    );
    CREATE INDEX alerts_due ON alerts (delivered_at, failed_at, next_at);
    "#,
    // 8
    r#"
    ALTER TABLE card_usage_days ADD COLUMN succeeded BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE card_usage_days ADD COLUMN failed BIGINT NOT NULL DEFAULT 0;
    CREATE TABLE card_feedback (
        workspace   TEXT COLLATE "C" NOT NULL,
        card_id     TEXT COLLATE "C" NOT NULL,
        task_id     TEXT COLLATE "C" NOT NULL,
        prepared_at TEXT COLLATE "C" NOT NULL,
        verdict     TEXT COLLATE "C" NOT NULL,
        user_id     TEXT COLLATE "C",
        host        TEXT COLLATE "C" NOT NULL,
        note        TEXT,
        at          TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (workspace, card_id, task_id, prepared_at)
    );
    CREATE INDEX card_feedback_at ON card_feedback (workspace, at);
    CREATE TABLE card_flags (
        workspace  TEXT COLLATE "C" NOT NULL,
        card_id    TEXT COLLATE "C" NOT NULL,
        cleared_at TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (workspace, card_id)
    );
    "#,
];

/// The tables the store keeps, in an order that satisfies their foreign keys: what the
/// migration between engines copies. `changes` is PostgreSQL's alone.
pub(crate) const TABLES: &[&str] = &[
    "meta",
    "workspaces",
    "objects",
    "cards",
    "tombstones",
    "tokens",
    "history",
    "task_stores",
    "task_reinforcements",
    "receipts",
    "card_usage_days",
    "card_usage",
    "card_hosts",
    "asset_usage",
    "card_intake",
    "lesson_bands",
    "duplicate_groups",
    "rejections",
    "store_answers",
    "alerts",
    "card_feedback",
    "card_flags",
];

/// Brings an SQLite database to the newest schema.
pub(crate) fn migrate(conn: &mut Connection, path: &str) -> Result<()> {
    let sqlite = |context| {
        let path = path.to_owned();
        move |source: rusqlite::Error| StoreError::Database {
            db: path,
            context,
            source: source.into(),
        }
    };
    let known = MIGRATIONS.len() as i64;
    let found: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sqlite("read schema version"))?;
    if found > known {
        return Err(StoreError::TooNew {
            path: path.to_owned(),
            found,
            known,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Exclusive)
            .map_err(sqlite("begin migration"))?;
        tx.execute_batch(sql).map_err(sqlite("migrate"))?;
        tx.pragma_update(None, "user_version", i as i64 + 1)
            .map_err(sqlite("record schema version"))?;
        tx.commit().map_err(sqlite("commit migration"))?;
        tracing::info!(version = i + 1, "database schema migrated");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_engines_have_every_version() {
        assert_eq!(super::MIGRATIONS.len(), super::PG_MIGRATIONS.len());
    }
}
