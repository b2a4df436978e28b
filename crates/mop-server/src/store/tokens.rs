//! Bearer tokens. A token is `mop_<id>_<secret>`; only its SHA-256 is stored, and the id
//! (not secret) is what lists, logs and audit rows show. Scope (role and workspaces) is a
//! property of the token, never of a request.

use std::fmt;

use mop_cards::{is_slug, sha256_hex};
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use super::{Result, Store, StoreError, ensure_workspace, now};

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
}

/// A token as `token list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenRow {
    /// Public id.
    pub id: String,
    /// Role.
    pub role: Role,
    /// Workspaces in scope.
    pub workspaces: Vec<String>,
    /// Free note.
    pub note: Option<String>,
    /// Creation time.
    pub created_at: String,
    /// Revocation time.
    pub revoked_at: Option<String>,
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
    pub fn create_token(
        &self,
        role: Role,
        workspaces: &[String],
        note: Option<&str>,
    ) -> Result<(String, String)> {
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
                "INSERT INTO tokens (id, hash, role, workspaces, note, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![id, token_hash(&token), role.as_str(), list, note, now()],
            )
            .map_err(self.err("create token"))?;
            self.audit_token(tx, workspaces, "token_create", &format!("token={id} role={role}"))?;
            Ok(())
        })?;
        Ok((id, token))
    }

    /// Every token, newest first.
    pub fn list_tokens(&self) -> Result<Vec<TokenRow>> {
        self.read(|tx| {
            let mut stmt = tx
                .prepare("SELECT id, role, workspaces, note, created_at, revoked_at FROM tokens ORDER BY created_at DESC, id")
                .map_err(self.err("list tokens"))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(TokenRow {
                        id: r.get(0)?,
                        role: Role::parse(&r.get::<_, String>(1)?).unwrap_or(Role::Node),
                        workspaces: serde_json::from_str(&r.get::<_, String>(2)?).unwrap_or_default(),
                        note: r.get(3)?,
                        created_at: r.get(4)?,
                        revoked_at: r.get(5)?,
                    })
                })
                .map_err(self.err("list tokens"))?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(self.err("list tokens"))
        })
    }

    /// Revokes a token by id, with an audit row in each of its workspaces (in the same
    /// transaction). Revoking twice is not an error and writes nothing.
    pub fn revoke_token(&self, id: &str) -> Result<()> {
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
        tx: &rusqlite::Transaction<'_>,
        workspaces: &[String],
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
                "cli:token",
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

    /// Every token by hash, for the server's in-memory cache.
    pub fn token_table(&self) -> Result<Vec<(String, TokenInfo)>> {
        self.read(|tx| {
            let mut stmt = tx
                .prepare("SELECT hash, id, role, workspaces, revoked_at IS NOT NULL FROM tokens")
                .map_err(self.err("load tokens"))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        TokenInfo {
                            id: r.get(1)?,
                            role: Role::parse(&r.get::<_, String>(2)?).unwrap_or(Role::Node),
                            workspaces: serde_json::from_str(&r.get::<_, String>(3)?)
                                .unwrap_or_default(),
                            revoked: r.get(4)?,
                        },
                    ))
                })
                .map_err(self.err("load tokens"))?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
                .map_err(self.err("load tokens"))
        })
    }
}
