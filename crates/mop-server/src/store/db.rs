//! The narrow interface the store's SQL runs through, so one set of queries serves both
//! engines: SQLite (embedded, the default) and PostgreSQL (for several replicas).
//!
//! Queries are written once, in the SQL both engines accept, with `?N` placeholders;
//! PostgreSQL sees them rewritten to `$N` (see [`pg_sql`]). Values cross as
//! [`ValueRef`]s, and columns are read with [`Row::get`], which adapts to the column type
//! each engine reports (an SQLite INTEGER and a PostgreSQL BIGINT are both an `i64`).
//! Integers that are flags (0 or 1) stay integers on both engines, so no query depends on
//! how an engine spells booleans.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use postgres_types::{IsNull, Type};

/// Why a database call failed, by kind.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// A query that must return a row returned none.
    #[error("query returned no rows")]
    NoRows,
    /// SQLite failed.
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    /// The database file could not be made or its mode set.
    #[error(transparent)]
    File(#[from] std::io::Error),
    /// PostgreSQL failed (or its connection did).
    #[error(transparent)]
    Postgres(#[from] tokio_postgres::Error),
    /// No PostgreSQL connection could be had within the pool's wait (or the pool could
    /// not be set up).
    #[error("no database connection: {0}")]
    Pool(String),
    /// Connecting to PostgreSQL failed; the server's answer (wrong password, no such
    /// database) or the network's says why.
    #[error("cannot connect: {0}")]
    Connect(tokio_postgres::Error),
    /// The database's schema is newer than this build knows.
    #[error("schema version {found} is newer than this mop-server knows ({known})")]
    SchemaTooNew {
        /// The database's.
        found: i64,
        /// The newest this build knows.
        known: i64,
    },
    /// A column held something its reader cannot take.
    #[error("column {index}: {problem}")]
    Decode {
        /// 0-based column.
        index: usize,
        /// What was wrong.
        problem: String,
    },
}

impl DbError {
    /// True when the database could not be reached (down, restarting, refusing
    /// connections): the request may succeed later, so callers answer 503.
    pub fn is_unavailable(&self) -> bool {
        match self {
            DbError::Pool(_) => true,
            DbError::Postgres(e) | DbError::Connect(e) => {
                if let Some(code) = e.code() {
                    let c = code.code();
                    // Transient by their SQLSTATE: the connection_exception class (08),
                    // insufficient resources (53: disk full, out of memory, too many
                    // connections), operator intervention (57: shutdown, restart, a
                    // statement timeout), a server turned read-only (25006: a standby),
                    // a lock or deadlock timeout (55P03, 40P01), a serialization failure.
                    // Not transient: a wrong password (28), no such database (3D), no
                    // privilege (42501), bad SQL: configuration or code to fix, a 500.
                    return c.starts_with("08")
                        || c.starts_with("53")
                        || c.starts_with("57")
                        || matches!(c, "25006" | "55P03" | "40P01" | "40001");
                }
                if e.is_closed() {
                    return true;
                }
                // No server answer at all: an I/O failure on the connection.
                let mut source = std::error::Error::source(e);
                while let Some(s) = source {
                    if s.is::<std::io::Error>() {
                        return true;
                    }
                    source = s.source();
                }
                false
            }
            DbError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => {
                matches!(
                    e.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                )
            }
            _ => false,
        }
    }

    /// Wraps a decoding failure of column `index`.
    pub fn decode(index: usize, problem: impl std::fmt::Display) -> DbError {
        DbError::Decode {
            index,
            problem: problem.to_string(),
        }
    }
}

/// A `Result` with [`DbError`].
pub type Result<T> = std::result::Result<T, DbError>;

/// `.optional()` on a single-row query: no row becomes `None`.
pub(crate) trait OptionalExtension<T> {
    fn optional(self) -> Result<Option<T>>;
}

impl<T> OptionalExtension<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(DbError::NoRows) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A value bound to a placeholder.
#[derive(Debug, Clone, Copy)]
pub enum ValueRef<'a> {
    /// SQL NULL.
    Null,
    /// An integer (flags are 0 or 1).
    Integer(i64),
    /// A float.
    Real(f64),
    /// Text.
    Text(&'a str),
    /// Bytes.
    Blob(&'a [u8]),
}

/// Something that can be bound to a placeholder.
pub trait ToValue {
    /// The value to bind.
    fn to_value(&self) -> ValueRef<'_>;
}

impl<T: ToValue + ?Sized> ToValue for &T {
    fn to_value(&self) -> ValueRef<'_> {
        (**self).to_value()
    }
}
impl ToValue for str {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Text(self)
    }
}
impl ToValue for String {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Text(self)
    }
}
impl ToValue for [u8] {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Blob(self)
    }
}
impl ToValue for Vec<u8> {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Blob(self)
    }
}
impl ToValue for i64 {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Integer(*self)
    }
}
impl ToValue for i32 {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Integer(i64::from(*self))
    }
}
impl ToValue for u32 {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Integer(i64::from(*self))
    }
}
impl ToValue for bool {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Integer(i64::from(*self))
    }
}
impl ToValue for f64 {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Real(*self)
    }
}
impl<T: ToValue> ToValue for Option<T> {
    fn to_value(&self) -> ValueRef<'_> {
        match self {
            Some(v) => v.to_value(),
            None => ValueRef::Null,
        }
    }
}
impl ToValue for ValueRef<'_> {
    fn to_value(&self) -> ValueRef<'_> {
        *self
    }
}

/// Placeholder values, in order: `params![ws, id.to_string(), rev as i64]`.
macro_rules! params {
    () => {
        &[] as &[&dyn $crate::store::db::ToValue]
    };
    ($($p:expr),+ $(,)?) => {
        &[$(&$p as &dyn $crate::store::db::ToValue),+] as &[&dyn $crate::store::db::ToValue]
    };
}
pub(crate) use params;

impl rusqlite::ToSql for ValueRef<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef as V};
        Ok(ToSqlOutput::Borrowed(match *self {
            ValueRef::Null => V::Null,
            ValueRef::Integer(i) => V::Integer(i),
            ValueRef::Real(f) => V::Real(f),
            ValueRef::Text(s) => V::Text(s.as_bytes()),
            ValueRef::Blob(b) => V::Blob(b),
        }))
    }
}

/// PostgreSQL infers each placeholder's type from the query; the value adapts to it, so
/// `LIMIT ?1` (int8), `substr(x, 1, ?1)` (int4) and `x = ?1` all take the same integer.
impl postgres_types::ToSql for ValueRef<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        let wrong = || format!("cannot send {self:?} as {ty}");
        match *self {
            ValueRef::Null => Ok(IsNull::Yes),
            ValueRef::Integer(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(i)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(i)?.to_sql(ty, out),
                Type::BOOL => (i != 0).to_sql(ty, out),
                Type::FLOAT8 => (i as f64).to_sql(ty, out),
                Type::TEXT | Type::VARCHAR => i.to_string().to_sql(ty, out),
                _ => Err(wrong().into()),
            },
            ValueRef::Real(f) => match *ty {
                Type::FLOAT8 => f.to_sql(ty, out),
                Type::FLOAT4 => (f as f32).to_sql(ty, out),
                _ => Err(wrong().into()),
            },
            ValueRef::Text(s) => match *ty {
                Type::BYTEA => s.as_bytes().to_sql(ty, out),
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    s.to_sql(ty, out)
                }
                _ => Err(wrong().into()),
            },
            ValueRef::Blob(b) => match *ty {
                Type::BYTEA => b.to_sql(ty, out),
                // Text columns hold UTF-8 only; a blob bound to one must be text already.
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    std::str::from_utf8(b)?.to_sql(ty, out)
                }
                _ => Err(wrong().into()),
            },
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    postgres_types::to_sql_checked!();
}

/// A row being read.
pub enum Row<'a> {
    /// From SQLite.
    Sqlite(&'a rusqlite::Row<'a>),
    /// From PostgreSQL.
    Postgres(&'a tokio_postgres::Row),
}

impl Row<'_> {
    /// Column `index` (0-based) as `T`.
    pub fn get<T: FromColumn>(&self, index: usize) -> Result<T> {
        match self {
            Row::Sqlite(r) => T::from_sqlite(r, index),
            Row::Postgres(r) => T::from_pg(r, index),
        }
    }
}

/// A type a column can be read as.
pub trait FromColumn: Sized {
    /// From an SQLite row.
    fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> Result<Self>;
    /// From a PostgreSQL row.
    fn from_pg(row: &tokio_postgres::Row, index: usize) -> Result<Self>;
}

fn pg_type(row: &tokio_postgres::Row, index: usize) -> Result<&Type> {
    row.columns()
        .get(index)
        .map(|c| c.type_())
        .ok_or_else(|| DbError::decode(index, "no such column"))
}

/// Reads any column and says only whether it is NULL.
struct Nullness(bool);

impl<'a> postgres_types::FromSql<'a> for Nullness {
    fn from_sql(
        _: &Type,
        _: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Nullness(false))
    }
    fn from_sql_null(
        _: &Type,
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Nullness(true))
    }
    fn accepts(_: &Type) -> bool {
        true
    }
}

impl FromColumn for i64 {
    fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> Result<Self> {
        Ok(row.get(index)?)
    }
    fn from_pg(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
        Ok(match *pg_type(row, index)? {
            Type::INT4 => i64::from(row.try_get::<_, i32>(index)?),
            Type::INT2 => i64::from(row.try_get::<_, i16>(index)?),
            Type::BOOL => i64::from(row.try_get::<_, bool>(index)?),
            _ => row.try_get::<_, i64>(index)?,
        })
    }
}

impl FromColumn for u64 {
    fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> Result<Self> {
        Ok(i64::from_sqlite(row, index)? as u64)
    }
    fn from_pg(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
        Ok(i64::from_pg(row, index)? as u64)
    }
}

impl FromColumn for bool {
    fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> Result<Self> {
        Ok(i64::from_sqlite(row, index)? != 0)
    }
    fn from_pg(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
        Ok(i64::from_pg(row, index)? != 0)
    }
}

impl FromColumn for f64 {
    fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> Result<Self> {
        Ok(row.get(index)?)
    }
    fn from_pg(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
        Ok(match *pg_type(row, index)? {
            Type::FLOAT4 => f64::from(row.try_get::<_, f32>(index)?),
            Type::INT8 | Type::INT4 | Type::INT2 => i64::from_pg(row, index)? as f64,
            _ => row.try_get::<_, f64>(index)?,
        })
    }
}

impl FromColumn for String {
    fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> Result<Self> {
        Ok(row.get(index)?)
    }
    fn from_pg(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
        Ok(row.try_get::<_, String>(index)?)
    }
}

/// A stored time (written by [`super::stamp`]); anything else in the column is a decode
/// error naming the column, never a guess.
impl FromColumn for mop_proto::time::Stamp {
    fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> Result<Self> {
        String::from_sqlite(row, index)?
            .parse()
            .map_err(|e: mop_proto::time::StampError| DbError::decode(index, e.to_string()))
    }
    fn from_pg(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
        String::from_pg(row, index)?
            .parse()
            .map_err(|e: mop_proto::time::StampError| DbError::decode(index, e.to_string()))
    }
}

impl FromColumn for Vec<u8> {
    fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> Result<Self> {
        Ok(row.get(index)?)
    }
    fn from_pg(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
        Ok(match *pg_type(row, index)? {
            Type::BYTEA => row.try_get::<_, Vec<u8>>(index)?,
            _ => row.try_get::<_, String>(index)?.into_bytes(),
        })
    }
}

impl<T: FromColumn> FromColumn for Option<T> {
    fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> Result<Self> {
        match row.get_ref(index)? {
            rusqlite::types::ValueRef::Null => Ok(None),
            _ => T::from_sqlite(row, index).map(Some),
        }
    }
    fn from_pg(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
        if row.try_get::<_, Nullness>(index)?.0 {
            Ok(None)
        } else {
            T::from_pg(row, index).map(Some)
        }
    }
}

/// An owned value: what the migration copies and hashes, column by column.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// An integer.
    Integer(i64),
    /// A float.
    Real(f64),
    /// Text.
    Text(String),
    /// Bytes.
    Blob(Vec<u8>),
}

impl Value {
    /// The value to bind.
    pub fn as_ref(&self) -> ValueRef<'_> {
        match self {
            Value::Null => ValueRef::Null,
            Value::Integer(i) => ValueRef::Integer(*i),
            Value::Real(f) => ValueRef::Real(*f),
            Value::Text(s) => ValueRef::Text(s),
            Value::Blob(b) => ValueRef::Blob(b),
        }
    }
}

impl ToValue for Value {
    fn to_value(&self) -> ValueRef<'_> {
        self.as_ref()
    }
}

impl FromColumn for Value {
    fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> Result<Self> {
        use rusqlite::types::ValueRef as V;
        Ok(match row.get_ref(index)? {
            V::Null => Value::Null,
            V::Integer(i) => Value::Integer(i),
            V::Real(f) => Value::Real(f),
            V::Text(t) => Value::Text(
                std::str::from_utf8(t)
                    .map_err(|e| DbError::decode(index, e))?
                    .to_owned(),
            ),
            V::Blob(b) => Value::Blob(b.to_vec()),
        })
    }
    fn from_pg(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
        if row.try_get::<_, Nullness>(index)?.0 {
            return Ok(Value::Null);
        }
        Ok(match *pg_type(row, index)? {
            Type::INT8 | Type::INT4 | Type::INT2 | Type::BOOL => {
                Value::Integer(i64::from_pg(row, index)?)
            }
            Type::FLOAT8 | Type::FLOAT4 => Value::Real(f64::from_pg(row, index)?),
            Type::BYTEA => Value::Blob(row.try_get(index)?),
            _ => Value::Text(row.try_get(index)?),
        })
    }
}

/// An open transaction on either engine. Every store query goes through one of these.
pub struct Tx<'a> {
    inner: TxInner<'a>,
}

enum TxInner<'a> {
    Sqlite(&'a rusqlite::Transaction<'a>),
    Postgres {
        tx: &'a deadpool_postgres::Transaction<'a>,
        rt: &'a tokio::runtime::Handle,
    },
}

impl<'a> Tx<'a> {
    pub(crate) fn sqlite(tx: &'a rusqlite::Transaction<'a>) -> Tx<'a> {
        Tx {
            inner: TxInner::Sqlite(tx),
        }
    }

    pub(crate) fn postgres(
        tx: &'a deadpool_postgres::Transaction<'a>,
        rt: &'a tokio::runtime::Handle,
    ) -> Tx<'a> {
        Tx {
            inner: TxInner::Postgres { tx, rt },
        }
    }

    /// True on PostgreSQL: for the few statements the engines spell differently.
    pub fn is_postgres(&self) -> bool {
        matches!(self.inner, TxInner::Postgres { .. })
    }

    /// Runs one statement; the number of rows it changed.
    pub fn execute(&self, sql: &str, params: &[&dyn ToValue]) -> Result<usize> {
        match &self.inner {
            TxInner::Sqlite(tx) => {
                let mut stmt = tx.prepare_cached(sql)?;
                Ok(stmt.execute(rusqlite::params_from_iter(
                    params.iter().map(|p| p.to_value()),
                ))?)
            }
            TxInner::Postgres { tx, rt } => {
                let values: Vec<ValueRef<'_>> = params.iter().map(|p| p.to_value()).collect();
                let refs: Vec<&(dyn postgres_types::ToSql + Sync)> = values
                    .iter()
                    .map(|v| v as &(dyn postgres_types::ToSql + Sync))
                    .collect();
                let sql = pg_sql(sql);
                rt.block_on(async {
                    let stmt = tx.prepare_cached(&sql).await?;
                    Ok(tx.execute(&stmt, &refs).await? as usize)
                })
            }
        }
    }

    /// Runs several statements without parameters (migrations).
    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match &self.inner {
            TxInner::Sqlite(tx) => Ok(tx.execute_batch(sql)?),
            TxInner::Postgres { tx, rt } => Ok(rt.block_on(tx.batch_execute(sql))?),
        }
    }

    /// Every row of a query, each mapped by `f`.
    pub fn query_map<T>(
        &self,
        sql: &str,
        params: &[&dyn ToValue],
        mut f: impl FnMut(&Row<'_>) -> Result<T>,
    ) -> Result<Vec<T>> {
        match &self.inner {
            TxInner::Sqlite(tx) => {
                let mut stmt = tx.prepare_cached(sql)?;
                let mut rows = stmt.query(rusqlite::params_from_iter(
                    params.iter().map(|p| p.to_value()),
                ))?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    out.push(f(&Row::Sqlite(r))?);
                }
                Ok(out)
            }
            TxInner::Postgres { tx, rt } => {
                let values: Vec<ValueRef<'_>> = params.iter().map(|p| p.to_value()).collect();
                let refs: Vec<&(dyn postgres_types::ToSql + Sync)> = values
                    .iter()
                    .map(|v| v as &(dyn postgres_types::ToSql + Sync))
                    .collect();
                let sql = pg_sql(sql);
                let rows = rt.block_on(async {
                    let stmt = tx.prepare_cached(&sql).await?;
                    tx.query(&stmt, &refs).await
                })?;
                rows.iter().map(|r| f(&Row::Postgres(r))).collect()
            }
        }
    }

    /// The first row of a query, mapped by `f`; [`DbError::NoRows`] when there is none.
    pub fn query_row<T>(
        &self,
        sql: &str,
        params: &[&dyn ToValue],
        f: impl FnOnce(&Row<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut f = Some(f);
        let mut first = None;
        // Only the first row is mapped; SQLite stops reading there.
        match &self.inner {
            TxInner::Sqlite(tx) => {
                let mut stmt = tx.prepare_cached(sql)?;
                let mut rows = stmt.query(rusqlite::params_from_iter(
                    params.iter().map(|p| p.to_value()),
                ))?;
                if let Some(r) = rows.next()? {
                    first = Some((f.take().expect("called once"))(&Row::Sqlite(r))?);
                }
            }
            TxInner::Postgres { .. } => {
                let mut rows = self.query_map(sql, params, |r| Ok(f.take().map(|f| f(r))))?;
                if !rows.is_empty() {
                    first = rows.swap_remove(0).transpose()?;
                }
            }
        }
        first.ok_or(DbError::NoRows)
    }

    /// A statement to run one or more times. Both engines keep prepared statements per
    /// connection, so this only names the SQL.
    pub fn prepare<'t>(&'t self, sql: &'t str) -> Result<Stmt<'t, 'a>> {
        Ok(Stmt { tx: self, sql })
    }

    /// The same as [`Tx::prepare`]; kept so call sites say which statements repeat.
    pub fn prepare_cached<'t>(&'t self, sql: &'t str) -> Result<Stmt<'t, 'a>> {
        self.prepare(sql)
    }
}

/// A statement of a [`Tx`].
pub struct Stmt<'t, 'a> {
    tx: &'t Tx<'a>,
    sql: &'t str,
}

impl Stmt<'_, '_> {
    /// See [`Tx::execute`].
    pub fn execute(&mut self, params: &[&dyn ToValue]) -> Result<usize> {
        self.tx.execute(self.sql, params)
    }

    /// Every row, each mapped by `f`, as an iterator of results.
    pub fn query_map<T>(
        &mut self,
        params: &[&dyn ToValue],
        mut f: impl FnMut(&Row<'_>) -> Result<T>,
    ) -> Result<std::vec::IntoIter<Result<T>>> {
        Ok(self
            .tx
            .query_map(self.sql, params, |r| Ok(f(r)))?
            .into_iter())
    }

    /// See [`Tx::query_row`].
    pub fn query_row<T>(
        &mut self,
        params: &[&dyn ToValue],
        f: impl FnOnce(&Row<'_>) -> Result<T>,
    ) -> Result<T> {
        self.tx.query_row(self.sql, params, f)
    }
}

/// `?N` placeholders as PostgreSQL's `$N`, outside single-quoted strings. Translations are
/// kept: the store's queries are a fixed set. The store's SQL has no double-quoted
/// identifiers, comments or dollar quoting, which this does not understand.
pub(crate) fn pg_sql(sql: &str) -> Arc<str> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<str>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    if let Some(hit) = cache.lock().get(sql) {
        return hit.clone();
    }
    let translated: Arc<str> = translate(sql).into();
    let mut map = cache.lock();
    // Queries built at run time (IN lists of varying length) must not grow it forever.
    if map.len() > 4096 {
        map.clear();
    }
    map.insert(sql.to_owned(), translated.clone());
    translated
}

fn translate(sql: &str) -> Cow<'_, str> {
    if !sql.contains('?') {
        return Cow::Borrowed(sql);
    }
    let mut out = String::with_capacity(sql.len());
    let mut quoted = false;
    for c in sql.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push(c);
            }
            '?' if !quoted => out.push('$'),
            _ => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::translate;

    #[test]
    fn placeholders_become_dollars_outside_strings_only() {
        assert_eq!(
            translate("SELECT a FROM t WHERE b = ?1 AND c = '?2' AND d IN (?3, ?12)"),
            "SELECT a FROM t WHERE b = $1 AND c = '?2' AND d IN ($3, $12)"
        );
    }
}
