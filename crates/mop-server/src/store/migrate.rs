//! `mop-server migrate`: copies a whole database from one engine to another (SQLite to
//! PostgreSQL, or back), table by table and row by row, in one target transaction, then
//! checks that every table has the same row count and the same content hash on both sides.
//!
//! The copy keeps the epoch, revisions, history sequence numbers, tokens (their hashes) and
//! counters: daemons that synced from the old database go on from the new one with 304s.
//! A target that already holds data is refused, unless it holds exactly the source's data
//! (a second run then reports so and changes nothing) or `replace` is given. A failed copy
//! rolls back and leaves the target as it was.

use sha2::{Digest, Sha256};

use super::db::{Tx, Value, ValueRef, params};
use super::schema::TABLES;
use super::{Database, Result, Store, StoreError};

/// One table as both sides hold it after the copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCheck {
    /// The table.
    pub table: &'static str,
    /// Its rows.
    pub rows: u64,
    /// SHA-256 over its rows in key order (the same on both sides, or the copy failed).
    pub sha256: String,
}

/// What a migration did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// Every table, checked.
    pub tables: Vec<TableCheck>,
    /// True when the target held the same data already and nothing was written.
    pub already: bool,
    /// The epoch both now share.
    pub epoch: String,
}

/// Copies `from` into `to`. `progress` hears about each table as it is copied.
pub fn migrate(
    from: &Database,
    to: &Database,
    replace: bool,
    mut progress: impl FnMut(&str, u64),
) -> Result<MigrateReport> {
    if from == to {
        return Err(StoreError::Invalid(
            "--from and --to name the same database".to_owned(),
        ));
    }
    let source = Store::connect_existing(from)?;
    let target = Store::connect(to)?;
    let before = source.read(|tx| checks(&source, tx))?;
    let found = target.read(|tx| checks(&target, tx))?;
    if found == before && target.epoch() == source.epoch() {
        return Ok(MigrateReport {
            tables: before,
            already: true,
            epoch: source.epoch().to_owned(),
        });
    }
    let holds: Vec<String> = found
        .iter()
        .filter(|c| c.table != "meta" && c.rows > 0)
        .map(|c| format!("{} {}", c.rows, c.table))
        .collect();
    if !holds.is_empty() && !replace {
        return Err(StoreError::Conflict(format!(
            "{} is not empty (it holds {}); nothing was copied: migrate into an empty database, or pass --replace to overwrite it with {}",
            target.shown(),
            holds.join(", "),
            source.shown()
        )));
    }
    source.read(|stx| {
        target.write(|ttx| {
            let e = target.err("copy");
            for table in TABLES.iter().rev() {
                ttx.execute(&format!("DELETE FROM {table}"), params![])
                    .map_err(&e)?;
            }
            for table in TABLES {
                let columns = columns(&source, stx, table)?;
                let list = columns.join(", ");
                let marks: Vec<String> = (1..=columns.len()).map(|i| format!("?{i}")).collect();
                let insert = format!("INSERT INTO {table} ({list}) VALUES ({})", marks.join(", "));
                let mut copied = 0u64;
                let rows = rows(&source, stx, table, &columns)?;
                for row in &rows {
                    let values: Vec<ValueRef<'_>> = row.iter().map(Value::as_ref).collect();
                    let refs: Vec<&dyn super::db::ToValue> = values
                        .iter()
                        .map(|v| v as &dyn super::db::ToValue)
                        .collect();
                    ttx.execute(&insert, &refs).map_err(&e)?;
                    copied += 1;
                }
                progress(table, copied);
            }
            if ttx.is_postgres() {
                // Rows were inserted with their own sequence numbers; new ones go on after.
                ttx.execute(
                    "SELECT setval(pg_get_serial_sequence('history', 'seq'),
                                   COALESCE((SELECT MAX(seq) FROM history), 0) + 1, false)",
                    params![],
                )
                .map_err(&e)?;
            }
            Ok(())
        })
    })?;
    // A fresh connection reads the target back, so the check is of what was committed.
    let target = Store::connect(to)?;
    let after = target.read(|tx| checks(&target, tx))?;
    if after != before {
        let differ: Vec<&str> = before
            .iter()
            .zip(&after)
            .filter(|(a, b)| a != b)
            .map(|(a, _)| a.table)
            .collect();
        return Err(StoreError::Invalid(format!(
            "the copy in {} differs from {} in {}; run the migration again with --replace",
            target.shown(),
            source.shown(),
            differ.join(", ")
        )));
    }
    Ok(MigrateReport {
        tables: after,
        already: false,
        epoch: target.epoch().to_owned(),
    })
}

/// The columns of `table`, in their schema order.
fn columns(store: &Store, tx: &Tx<'_>, table: &str) -> Result<Vec<String>> {
    let sql = if tx.is_postgres() {
        "SELECT column_name::text FROM information_schema.columns
         WHERE table_schema = current_schema() AND table_name = ?1 ORDER BY ordinal_position"
    } else {
        "SELECT name FROM pragma_table_info(?1) ORDER BY cid"
    };
    tx.query_map(sql, params![table], |r| r.get(0))
        .map_err(store.err("list columns"))
}

/// Every row of `table`, as values, in one order on both engines: sorted here, not by the
/// database, because the engines sort NULLs differently.
fn rows(store: &Store, tx: &Tx<'_>, table: &str, columns: &[String]) -> Result<Vec<Vec<Value>>> {
    let sql = format!("SELECT {} FROM {table}", columns.join(", "));
    let mut rows: Vec<Vec<Value>> = tx
        .query_map(&sql, params![], |r| {
            (0..columns.len()).map(|i| r.get::<Value>(i)).collect()
        })
        .map_err(store.err("read rows"))?;
    rows.sort_by(|a, b| {
        a.iter()
            .zip(b)
            .map(|(x, y)| order(x, y))
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    Ok(rows)
}

/// A total order on values: NULL, integers, reals, text, bytes; within a kind, by value.
fn order(a: &Value, b: &Value) -> std::cmp::Ordering {
    let rank = |v: &Value| match v {
        Value::Null => 0,
        Value::Integer(_) => 1,
        Value::Real(_) => 2,
        Value::Text(_) => 3,
        Value::Blob(_) => 4,
    };
    match (a, b) {
        (Value::Integer(x), Value::Integer(y)) => x.cmp(y),
        (Value::Real(x), Value::Real(y)) => x.total_cmp(y),
        (Value::Text(x), Value::Text(y)) => x.cmp(y),
        (Value::Blob(x), Value::Blob(y)) => x.cmp(y),
        _ => rank(a).cmp(&rank(b)),
    }
}

/// Row counts and content hashes of every table. The columns are the source's, named,
/// so two engines that order a table's columns differently still hash alike.
fn checks(store: &Store, tx: &Tx<'_>) -> Result<Vec<TableCheck>> {
    let mut out = Vec::new();
    for table in TABLES {
        let mut columns = columns(store, tx, table)?;
        columns.sort();
        let mut hash = Sha256::new();
        let rows = rows(store, tx, table, &columns)?;
        for row in &rows {
            for value in row {
                feed(&mut hash, value);
            }
        }
        out.push(TableCheck {
            table,
            rows: rows.len() as u64,
            sha256: format!("{:x}", hash.finalize()),
        });
    }
    // The epoch row is compared through `Store::epoch`; `created_at` and `backup_of` are
    // in the meta hash like any row.
    Ok(out)
}

/// A value as hashed: a type tag, the length, the bytes. Unambiguous across rows.
fn feed(hash: &mut Sha256, value: &Value) {
    match value {
        Value::Null => hash.update([0u8]),
        Value::Integer(i) => {
            hash.update([1u8]);
            hash.update(i.to_be_bytes());
        }
        Value::Real(f) => {
            hash.update([2u8]);
            hash.update(f.to_bits().to_be_bytes());
        }
        Value::Text(s) => {
            hash.update([3u8]);
            hash.update((s.len() as u64).to_be_bytes());
            hash.update(s.as_bytes());
        }
        Value::Blob(b) => {
            hash.update([4u8]);
            hash.update((b.len() as u64).to_be_bytes());
            hash.update(b);
        }
    }
}
