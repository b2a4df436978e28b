//! Bearer tokens. A token is `mop_<id>_<secret>`; only its SHA-256 is stored, and the id
//! (not secret) is what lists, logs and audit rows show. Scope (role and workspaces) is a
//! property of the token, never of a request.

use std::fmt;

use super::db::{OptionalExtension, Tx, params};
use jiff::Timestamp;
use mop_cards::{is_scope_id, is_slug, sha256_hex};
pub use mop_proto::curation::TokenRow;
use serde::Serialize;

use super::{Result, Store, StoreError, db, ensure_workspace, now, stamp};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A host daemon: read manifests and objects, store memories.
    Node,
    /// A curator: everything a node can, plus the admin endpoints.
    Admin,
}

impl Role {
    /// `node` or `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Node => "node",
            Role::Admin => "admin",
        }
    }

    /// Parses `node` or `admin`.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "node" => Some(Role::Node),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A live token as the server's cache holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    /// Public id.
    pub id: String,
    /// Role.
    pub role: Role,
    /// Workspaces in scope.
    pub workspaces: Vec<String>,
    /// When it was revoked, if it was.
    pub revoked: bool,
    /// The person behind it (admin tokens), named in the audit.
    pub name: Option<String>,
    /// When it stops working.
    pub expires_at: Option<Timestamp>,
}

impl TokenInfo {
    /// True once its expiry has passed.
    pub fn expired(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|t| t <= now)
    }
}

/// What a new token is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewToken<'a> {
    /// Role.
    pub role: Role,
    /// Workspaces in scope (at least one).
    pub workspaces: &'a [String],
    /// Free note.
    pub note: Option<&'a str>,
    /// The person who will use it; required for admin tokens, so the audit can say who
    /// verified or edited what.
    pub name: Option<&'a str>,
    /// When it stops working.
    pub expires_at: Option<Timestamp>,
    /// Who creates it, as the audit names actors (`cli:token`, `token:<id>`).
    pub actor: &'a str,
}

/// The SHA-256 under which a token is stored and looked up.
pub fn token_hash(token: &str) -> String {
    sha256_hex(token.as_bytes())
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).expect("the OS random source works");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

impl Store {
    /// Creates a token and returns it. The token itself is shown only this once.
    pub fn create_token(&self, new: &NewToken<'_>) -> Result<(String, String)> {
        let NewToken {
            role,
            workspaces,
            note,
            name,
            expires_at,
            actor,
        } = *new;
        match name {
            Some(n) if !is_scope_id(n) => {
                return Err(StoreError::Invalid(
                    "--name must be 1 to 128 characters with no control characters and no outer spaces".into(),
                ));
            }
            None if role == Role::Admin => {
                return Err(StoreError::Invalid(
                    "an admin token needs --name: the person who will use it, so the audit can say who verified or edited what".into(),
                ));
            }
            _ => {}
        }
        // Control characters (NUL above all, which PostgreSQL's text refuses) have no place
        // in a note that lists and audits show.
        if note.is_some_and(|n| n.chars().count() > 500 || n.chars().any(char::is_control)) {
            return Err(StoreError::Invalid(
                "--note must be at most 500 characters with no control characters".into(),
            ));
        }
        if expires_at.is_some_and(|t| t <= Timestamp::now()) {
            return Err(StoreError::Invalid(
                "--expires-in must lie in the future".into(),
            ));
        }
        if workspaces.is_empty() {
            return Err(StoreError::Invalid(
                "a token needs at least one --workspace".into(),
            ));
        }
        for ws in workspaces {
            if !is_slug(ws) {
                return Err(StoreError::Invalid(format!(
                    "workspace {ws:?} must be a lowercase slug matching [a-z0-9][a-z0-9._-]{{0,63}}"
                )));
            }
        }
        let id = format!("tok{}", random_hex(4));
        let token = format!("mop_{id}_{}", random_hex(32));
        let list = serde_json::to_string(workspaces).expect("strings serialize");
        self.write(|tx| {
            for ws in workspaces {
                ensure_workspace(tx, ws).map_err(self.err("create workspace"))?;
            }
            tx.execute(
                "INSERT INTO tokens (id, hash, role, workspaces, note, created_at, name, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![id, token_hash(&token), role.as_str(), list, note, now(), name, expires_at.map(stamp)],
            )
            .map_err(self.err("create token"))?;
            let mut detail = format!("token={id} role={role}");
            if let Some(n) = name {
                detail.push_str(&format!(" name={n}"));
            }
            self.audit_token(tx, workspaces, actor, "token_create", &detail)?;
            Ok(())
        })?;
        Ok((id, token))
    }

    /// Every token, newest first.
    pub fn list_tokens(&self) -> Result<Vec<TokenRow>> {
        self.read(|tx| {
            let mut stmt = tx
                .prepare(
                    "SELECT id, role, workspaces, note, created_at, revoked_at, name, expires_at, last_used_at
                     FROM tokens ORDER BY created_at DESC, id",
                )
                .map_err(self.err("list tokens"))?;
            let rows = stmt
                .query_map(params![], |r| {
                    Ok(TokenRow {
                        id: r.get(0)?,
                        role: r.get(1)?,
                        workspaces: serde_json::from_str(&r.get::<String>(2)?).unwrap_or_default(),
                        note: r.get(3)?,
                        created_at: r.get(4)?,
                        revoked_at: r.get(5)?,
                        name: r.get(6)?,
                        expires_at: r.get(7)?,
                        last_used_at: r.get(8)?,
                    })
                })
                .map_err(self.err("list tokens"))?;
            rows.collect::<db::Result<Vec<_>>>().map_err(self.err("list tokens"))
        })
    }

    /// Revokes a token by id, with an audit row in each of its workspaces (in the same
    /// transaction). Revoking twice is not an error and writes nothing.
    pub fn revoke_token(&self, id: &str, actor: &str) -> Result<()> {
        self.write(|tx| {
            let found: Option<(Option<String>, String, String)> = tx
                .query_row(
                    "SELECT revoked_at, workspaces, role FROM tokens WHERE id = ?1",
                    params![id],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()
                .map_err(self.err("find token"))?;
            match found {
                None => Err(StoreError::NotFound(format!(
                    "no token with id {id:?}; `mop-server token list` shows the ids"
                ))),
                Some((Some(_), _, _)) => Ok(()),
                Some((None, workspaces, role)) => {
                    tx.execute(
                        "UPDATE tokens SET revoked_at = ?1 WHERE id = ?2",
                        params![now(), id],
                    )
                    .map_err(self.err("revoke token"))?;
                    let workspaces: Vec<String> =
                        serde_json::from_str(&workspaces).unwrap_or_default();
                    self.audit_token(
                        tx,
                        &workspaces,
                        actor,
                        "token_revoke",
                        &format!("token={id} role={role}"),
                    )?;
                    Ok(())
                }
            }
        })
    }

    /// One audit row per workspace the token reaches.
    fn audit_token(
        &self,
        tx: &Tx<'_>,
        workspaces: &[String],
        actor: &str,
        action: &str,
        detail: &str,
    ) -> Result<()> {
        for ws in workspaces {
            let revision: i64 = tx
                .query_row(
                    "SELECT revision FROM workspaces WHERE name = ?1",
                    params![ws],
                    |r| r.get(0),
                )
                .map_err(self.err("audit token"))?;
            super::cards::audit(
                tx,
                ws,
                None,
                revision as u64,
                actor,
                action,
                None,
                None,
                None,
                Some(detail),
            )
            .map_err(self.err("audit token"))?;
        }
        Ok(())
    }

    /// Records when tokens were last used (the server batches these, at most one write a
    /// minute, so polls stay free of writes).
    pub fn record_token_uses(&self, uses: &[(String, Timestamp)]) -> Result<()> {
        if uses.is_empty() {
            return Ok(());
        }
        self.write(|tx| {
            for (id, at) in uses {
                tx.execute(
                    "UPDATE tokens SET last_used_at = ?2 WHERE id = ?1 AND (last_used_at IS NULL OR last_used_at < ?2)",
                    params![id, stamp(*at)],
                )
                .map_err(self.err("record token use"))?;
            }
            Ok(())
        })
    }

    /// Every token by hash, for the server's in-memory cache.
    pub fn token_table(&self) -> Result<Vec<(String, TokenInfo)>> {
        self.read(|tx| {
            let mut stmt = tx
                .prepare("SELECT hash, id, role, workspaces, revoked_at IS NOT NULL, name, expires_at FROM tokens")
                .map_err(self.err("load tokens"))?;
            let rows = stmt
                .query_map(params![], |r| {
                    Ok((
                        r.get::<String>(0)?,
                        TokenInfo {
                            id: r.get(1)?,
                            role: Role::parse(&r.get::<String>(2)?).unwrap_or(Role::Node),
                            workspaces: serde_json::from_str(&r.get::<String>(3)?)
                                .unwrap_or_default(),
                            revoked: r.get(4)?,
                            name: r.get(5)?,
                            // An expiry that does not read back fails closed.
                            expires_at: r
                                .get::<Option<String>>(6)?
                                .map(|t| t.parse().unwrap_or(Timestamp::UNIX_EPOCH)),
                        },
                    ))
                })
                .map_err(self.err("load tokens"))?;
            rows.collect::<db::Result<Vec<_>>>()
                .map_err(self.err("load tokens"))
        })
    }
}
