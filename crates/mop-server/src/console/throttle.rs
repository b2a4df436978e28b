//! Failed console logins, per source: each failure spends one unit of the source's bucket
//! (`console.login_failures_per_minute`). A source with none left still logs in with a
//! valid token (curators behind one proxy or tunnel share a source, and must not be locked
//! out by someone failing on purpose), but its wrong tokens are answered 429 without a
//! database lookup or a log line each. Every counted failure is logged with its source and
//! the failures since start, never the token; the metrics count logins by outcome.

use std::net::{IpAddr, SocketAddr};

use axum::extract::ConnectInfo;
use axum::http::HeaderMap;

use crate::rate::Buckets;

/// The failed-login buckets.
#[derive(Debug)]
pub struct LoginThrottle {
    failures: Buckets<IpAddr>,
    total: std::sync::atomic::AtomicU64,
}

impl LoginThrottle {
    /// Up to `per_minute` failed logins per source.
    pub fn new(per_minute: u32) -> LoginThrottle {
        LoginThrottle {
            failures: Buckets::new(per_minute.into()),
            total: Default::default(),
        }
    }

    /// `Err(seconds)` while `source` may not try again.
    pub fn check(&self, source: IpAddr) -> Result<(), u64> {
        self.failures.check(&source)
    }

    /// Counts one failure of `source` (if known); returns the failures since start.
    pub fn failed(&self, source: Option<IpAddr>) -> u64 {
        if let Some(source) = source {
            let _ = self.failures.take(&source);
        }
        self.total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .saturating_add(1)
    }
}

/// Where a login came from: the connection's peer, or, when that peer is one of
/// `trusted_proxies`, the last address its `X-Forwarded-For` names (the one the proxy
/// itself added). `None` when the connection has no IP peer.
pub fn source(
    peer: Option<&ConnectInfo<SocketAddr>>,
    headers: &HeaderMap,
    trusted_proxies: &[IpAddr],
) -> Option<IpAddr> {
    let peer = peer?.0.ip();
    if !trusted_proxies.contains(&peer) {
        return Some(peer);
    }
    let forwarded = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .last()
        .and_then(|a| a.trim().parse().ok());
    Some(forwarded.unwrap_or(peer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_is_believed_only_when_trusted() {
        let peer = ConnectInfo("10.0.0.9:5000".parse::<SocketAddr>().unwrap());
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "1.1.1.1, 2.2.2.2".parse().unwrap());
        let proxy: IpAddr = "10.0.0.9".parse().unwrap();
        assert_eq!(source(Some(&peer), &h, &[]), Some(proxy));
        assert_eq!(
            source(Some(&peer), &h, &[proxy]),
            Some("2.2.2.2".parse().unwrap())
        );
        assert_eq!(source(None, &h, &[proxy]), None);
    }
}
