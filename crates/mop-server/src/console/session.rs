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

/// Most sessions kept at once, unless `console.max_sessions` says otherwise; past it the
/// least recently used session of the workspace holding the most sessions ends.
pub const MAX_SESSIONS: usize = 10_000;
/// Most sessions one token may hold; past it that token's least recently used one ends,
/// so one curator logging in over and over cannot end everyone else's sessions.
const MAX_PER_TOKEN: usize = 100;
/// A session ends this long after login however busy it is.
const MAX_AGE: Duration = Duration::from_secs(12 * 3600);

/// One logged-in session.
#[derive(Debug, Clone)]
pub struct Session {
    /// The hash of the admin token that opened it.
    pub token_hash: String,
    /// The workspaces that token covered at login: the session counts against each.
    workspaces: Vec<String>,
    /// What each form of this session must send back as `_csrf`.
    pub csrf: String,
    /// The hash the map keys it by.
    pub key: String,
    /// What the last action did, shown once on the next page: (action, card id).
    flash: Option<(String, String)>,
    opened: Instant,
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
    max: usize,
}

fn random_hex() -> String {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf).expect("the OS random source works");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// The well-formed session ids a request's `Cookie` headers carry, in order. Every one is
/// tried: another site on the same host name can set a cookie of the same name that the
/// browser sends first.
pub fn cookie_ids(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
        .collect()
}

/// Whether the request carries a session cookie at all (well formed or not).
pub fn has_cookie(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .any(|pair| {
            pair.trim()
                .split_once('=')
                .is_some_and(|(n, _)| n == COOKIE)
        })
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

/// Ends the least recently used session of those `which` picks, if any.
fn evict_oldest(map: &mut HashMap<String, Session>, which: impl Fn(&Session) -> bool) {
    if let Some(oldest) = map
        .iter()
        .filter(|(_, s)| which(s))
        .min_by_key(|(_, s)| s.last_seen)
        .map(|(k, _)| k.clone())
    {
        map.remove(&oldest);
    }
}

/// Compares two secrets in time that does not depend on where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

impl Sessions {
    /// No sessions yet; each ends after `idle` without a request, and at most `max` are
    /// kept at once.
    pub fn new(idle: Duration, max: usize) -> Sessions {
        Sessions {
            map: Mutex::default(),
            idle,
            max: max.max(1),
        }
    }

    /// Opens a session for the token with hash `token_hash`, which covers `workspaces`;
    /// returns the cookie's id.
    ///
    /// A full table makes room in the workspace that holds the most sessions (its least
    /// recently used one ends), never in a smaller one: curators of one workspace logging
    /// in over and over, with as many tokens as they like, end only their own sessions.
    pub fn open(&self, token_hash: String, workspaces: Vec<String>) -> String {
        let id = random_hex();
        let now = Instant::now();
        let mut map = self.map.lock();
        map.retain(|_, s| self.live(s, now));
        let mine = map.values().filter(|s| s.token_hash == token_hash).count();
        if mine >= MAX_PER_TOKEN {
            evict_oldest(&mut map, |s| s.token_hash == token_hash);
        }
        if map.len() >= self.max {
            let mut counts: HashMap<&str, usize> = HashMap::new();
            for s in map.values() {
                for w in &s.workspaces {
                    *counts.entry(w.as_str()).or_default() += 1;
                }
            }
            let fullest = counts
                .into_iter()
                .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0)))
                .map(|(w, _)| w.to_owned());
            match fullest {
                Some(w) => evict_oldest(&mut map, |s| s.workspaces.contains(&w)),
                None => evict_oldest(&mut map, |_| true),
            }
        }
        let key = key_of(&id);
        map.insert(
            key.clone(),
            Session {
                token_hash,
                workspaces,
                csrf: random_hex(),
                key,
                flash: None,
                opened: now,
                last_seen: now,
            },
        );
        id
    }

    /// How many live sessions there are.
    #[cfg(test)]
    fn len(&self) -> usize {
        let now = Instant::now();
        self.map
            .lock()
            .values()
            .filter(|s| self.live(s, now))
            .count()
    }

    fn live(&self, s: &Session, now: Instant) -> bool {
        now.duration_since(s.last_seen) < self.idle && now.duration_since(s.opened) < MAX_AGE
    }

    /// The first live session the cookie ids name.
    pub fn get(&self, ids: &[String]) -> Lookup {
        let now = Instant::now();
        let mut map = self.map.lock();
        let mut expired = false;
        for id in ids {
            let key = key_of(id);
            match map.get(&key) {
                None => {}
                Some(s) if !self.live(s, now) => {
                    map.remove(&key);
                    expired = true;
                }
                Some(_) => {
                    let s = map.get_mut(&key).expect("just found");
                    s.last_seen = now;
                    return Lookup::Active(s.clone());
                }
            }
        }
        if expired {
            Lookup::Expired
        } else {
            Lookup::Missing
        }
    }

    /// Ends the sessions the cookie ids name.
    pub fn end(&self, ids: &[String]) {
        let mut map = self.map.lock();
        for id in ids {
            map.remove(&key_of(id));
        }
    }

    /// Notes what an action did, for the session's next page (kept here, not in the URL,
    /// so a link cannot make a page claim something was done).
    pub fn set_flash(&self, key: &str, action: &str, card: &str) {
        if let Some(s) = self.map.lock().get_mut(key) {
            s.flash = Some((action.to_owned(), card.to_owned()));
        }
    }

    /// Takes the note [`Sessions::set_flash`] left, once.
    pub fn take_flash(&self, key: &str) -> Option<(String, String)> {
        self.map.lock().get_mut(key)?.flash.take()
    }

    /// Ends every session opened with the token of this hash.
    pub fn end_all_of(&self, token_hash: &str) {
        self.map.lock().retain(|_, s| s.token_hash != token_hash);
    }
}

/// Session ids are stored hashed, like tokens.
fn key_of(id: &str) -> String {
    token_hash(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_ends_when_idle_and_at_logout() {
        let sessions = Sessions::new(Duration::from_millis(50), MAX_SESSIONS);
        let id = vec![sessions.open("h".into(), vec!["a".into()])];
        assert!(matches!(sessions.get(&id), Lookup::Active(_)));
        std::thread::sleep(Duration::from_millis(80));
        assert!(matches!(sessions.get(&id), Lookup::Expired));
        assert!(matches!(sessions.get(&id), Lookup::Missing));
        let id = vec![sessions.open("h".into(), vec!["a".into()])];
        sessions.end(&id);
        assert!(matches!(sessions.get(&id), Lookup::Missing));
        let other = vec![sessions.open("h2".into(), vec!["a".into()])];
        let mine = vec![sessions.open("h".into(), vec!["a".into()])];
        sessions.end_all_of("h");
        assert!(matches!(sessions.get(&mine), Lookup::Missing));
        assert!(matches!(sessions.get(&other), Lookup::Active(_)));
        // A planted id sent first does not hide the real one.
        let both = vec!["f".repeat(64), other[0].clone()];
        assert!(matches!(sessions.get(&both), Lookup::Active(_)));
    }

    #[test]
    fn one_token_cannot_crowd_out_the_others() {
        let sessions = Sessions::new(Duration::from_secs(60), MAX_SESSIONS);
        let theirs = vec![sessions.open("victim".into(), vec!["a".into()])];
        let first = vec![sessions.open("noisy".into(), vec!["a".into()])];
        for _ in 0..MAX_PER_TOKEN {
            sessions.open("noisy".into(), vec!["a".into()]);
        }
        assert!(
            matches!(sessions.get(&first), Lookup::Missing),
            "the noisy token's oldest ended"
        );
        assert!(matches!(sessions.get(&theirs), Lookup::Active(_)));
    }

    #[test]
    fn one_workspace_cannot_crowd_out_anothers_curators() {
        let sessions = Sessions::new(Duration::from_secs(60), 50);
        let ws = |w: &str| vec![w.to_owned()];
        let a: Vec<Vec<String>> = (0..5)
            .map(|i| vec![sessions.open(format!("a{i}"), ws("a"))])
            .collect();
        // A token over both workspaces counts in each.
        let both = vec![sessions.open("ab".into(), vec!["a".into(), "b".into()])];
        // Workspace b's admin logs in 400 times with 20 tokens.
        let first_b = vec![sessions.open("b0".into(), ws("b"))];
        for i in 0..400 {
            sessions.open(format!("b{}", i % 20), ws("b"));
        }
        assert_eq!(sessions.len(), 50);
        for id in &a {
            assert!(
                matches!(sessions.get(id), Lookup::Active(_)),
                "a's curators stay"
            );
        }
        // The control: b's own oldest sessions made the room (and the shared one, which
        // counted as b's too while b held the most).
        assert!(matches!(sessions.get(&first_b), Lookup::Missing));
        assert!(matches!(sessions.get(&both), Lookup::Missing));
    }

    #[test]
    fn only_a_well_formed_cookie_is_read() {
        let mut h = HeaderMap::new();
        let id = "a".repeat(64);
        h.insert(
            header::COOKIE,
            format!("x=1; {COOKIE}={id}; y=2").parse().unwrap(),
        );
        assert_eq!(cookie_ids(&h), vec![id]);
        h.insert(header::COOKIE, format!("{COOKIE}=zz").parse().unwrap());
        assert!(cookie_ids(&h).is_empty());
        assert!(has_cookie(&h));
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
    }
}
