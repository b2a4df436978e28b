//! Console sessions: a random id in an `HttpOnly; SameSite=Strict` cookie, mapped in memory
//! to the admin token that opened it (by the token's hash, never the token) and the
//! session's CSRF token.
//!
//! Only the SHA-256 of a session id is kept, so the map itself holds nothing a reader could
//! replay. A session ends when idle for `console.idle_secs`, at logout, and at the first
//! request after its token was revoked or expired: the token is looked up again on every
//! request. Sessions do not survive a server restart; curators log in again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::header;
use parking_lot::Mutex;

use crate::store::token_hash;

/// The cookie's name.
pub const COOKIE: &str = "mop_session";

/// Most sessions kept at once; past it the least recently used one ends (a login needs a
/// valid admin token, so this bounds only an admin's own carelessness).
const MAX_SESSIONS: usize = 10_000;

/// One logged-in session.
#[derive(Debug, Clone)]
pub struct Session {
    /// The hash of the admin token that opened it.
    pub token_hash: String,
    /// What each form of this session must send back as `_csrf`.
    pub csrf: String,
    last_seen: Instant,
}

/// What a cookie leads to.
#[derive(Debug)]
pub enum Lookup {
    /// A live session (its idle clock now restarted).
    Active(Session),
    /// The cookie named a session that ended by idling; it is gone now.
    Expired,
    /// No cookie, or one naming no session (ended by logout or a restart).
    Missing,
}

/// The live sessions.
#[derive(Debug)]
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
    idle: Duration,
}

fn random_hex() -> String {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf).expect("the OS random source works");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// The session id a request's `Cookie` headers carry, if well formed.
pub fn cookie_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The `Set-Cookie` value that gives the browser a session id.
pub fn set_cookie(id: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={id}; Path=/console; HttpOnly; SameSite=Strict{}",
        if secure { "; Secure" } else { "" }
    )
}

/// The `Set-Cookie` value that makes the browser forget its session id.
pub fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0{}",
        if secure { "; Secure" } else { "" }
    )
}

/// Compares two secrets in time that does not depend on where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Sessions {
    /// No sessions yet; each ends after `idle` without a request.
    pub fn new(idle: Duration) -> Sessions {
        Sessions {
            map: Mutex::default(),
            idle,
        }
    }

    /// Opens a session for the token with hash `token_hash`; returns the cookie's id.
    pub fn open(&self, token_hash: String) -> String {
        let id = random_hex();
        let now = Instant::now();
        let mut map = self.map.lock();
        map.retain(|_, s| now.duration_since(s.last_seen) < self.idle);
        if map.len() >= MAX_SESSIONS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.last_seen)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            token_hash_of(&id),
            Session {
                token_hash,
                csrf: random_hex(),
                last_seen: now,
            },
        );
        id
    }

    /// The session a cookie id names.
    pub fn get(&self, id: Option<&str>) -> Lookup {
        let Some(id) = id else {
            return Lookup::Missing;
        };
        let key = token_hash_of(id);
        let now = Instant::now();
        let mut map = self.map.lock();
        match map.get_mut(&key) {
            None => Lookup::Missing,
            Some(s) if now.duration_since(s.last_seen) >= self.idle => {
                map.remove(&key);
                Lookup::Expired
            }
            Some(s) => {
                s.last_seen = now;
                Lookup::Active(s.clone())
            }
        }
    }

    /// Ends the session a cookie id names.
    pub fn end(&self, id: &str) {
        self.map.lock().remove(&token_hash_of(id));
    }

    /// Ends every session opened with the token of this hash.
    pub fn end_all_of(&self, token_hash: &str) {
        self.map.lock().retain(|_, s| s.token_hash != token_hash);
    }
}

/// Session ids are stored hashed, like tokens.
fn token_hash_of(id: &str) -> String {
    token_hash(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_ends_when_idle_and_at_logout() {
        let sessions = Sessions::new(Duration::from_millis(50));
        let id = sessions.open("h".into());
        assert!(matches!(sessions.get(Some(&id)), Lookup::Active(_)));
        std::thread::sleep(Duration::from_millis(80));
        assert!(matches!(sessions.get(Some(&id)), Lookup::Expired));
        assert!(matches!(sessions.get(Some(&id)), Lookup::Missing));
        let id = sessions.open("h".into());
        sessions.end(&id);
        assert!(matches!(sessions.get(Some(&id)), Lookup::Missing));
        let other = sessions.open("h2".into());
        let mine = sessions.open("h".into());
        sessions.end_all_of("h");
        assert!(matches!(sessions.get(Some(&mine)), Lookup::Missing));
        assert!(matches!(sessions.get(Some(&other)), Lookup::Active(_)));
    }

    #[test]
    fn only_a_well_formed_cookie_is_read() {
        let mut h = HeaderMap::new();
        let id = "a".repeat(64);
        h.insert(
            header::COOKIE,
            format!("x=1; {COOKIE}={id}; y=2").parse().unwrap(),
        );
        assert_eq!(cookie_id(&h), Some(id));
        h.insert(header::COOKIE, format!("{COOKIE}=zz").parse().unwrap());
        assert_eq!(cookie_id(&h), None);
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
    }
}
