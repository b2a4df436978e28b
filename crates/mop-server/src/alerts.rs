//! The alert webhook: tells a configured URL when the review queue needs a curator.
//!
//! One task, started with the server when `alerts.webhook_url` is set, does two things:
//! every `alerts.scan_secs` it checks the queue for events not yet announced (the store's
//! [`Store::scan_alerts`](crate::store::Store::scan_alerts) keeps them as rows), and every
//! second it POSTs the events that are due. Each body is signed with HMAC-SHA256 under the
//! configured secret (`X-Mop-Signature: sha256=<hex>`); a failed attempt is retried after
//! a wait that doubles from one second up to `alerts.max_backoff_secs`, at most
//! `alerts.max_attempts` times. Nothing here runs on a store's path, and the rows outlive
//! a restart. Logs name the event's workspace, kind and subject (ids), never card text or
//! the secret.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hmac::{Hmac, Mac};
use jiff::{Timestamp, ToSpan};
use mop_proto::time::Stamp;
use sha2::Sha256;
use tokio::sync::watch;

use crate::config::Alerts;
use crate::state::AppState;
use crate::store::alerts::Alert;

/// How long one POST may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a claimed event is left to this server before another may send it.
const CLAIM_SECS: i64 = 60;
/// Events sent per tick.
const BATCH: usize = 16;

/// The webhook's settings, with its secret read.
pub struct Webhook {
    url: String,
    secret: Vec<u8>,
    config: Alerts,
    http: reqwest::Client,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("Webhook").field("url", &self.url).finish()
    }
}

/// The signature header's value for `body`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(body);
    format!("sha256={:x}", mac.finalize().into_bytes())
}

impl Webhook {
    /// The webhook `config` describes, or none when it names no URL. A secret file that
    /// cannot be read, or is empty, stops the server from starting.
    pub fn from_config(config: &Alerts) -> anyhow::Result<Option<Webhook>> {
        let Some(url) = config.webhook_url.clone() else {
            return Ok(None);
        };
        let path: &Path = config
            .webhook_secret_file
            .as_deref()
            .context("alerts.webhook_secret_file is required with alerts.webhook_url")?;
        let secret = std::fs::read(path).with_context(|| {
            format!("cannot read alerts.webhook_secret_file {}", path.display())
        })?;
        let secret = secret.trim_ascii().to_vec();
        if secret.is_empty() {
            anyhow::bail!(
                "alerts.webhook_secret_file {} is empty: put a long random secret in it",
                path.display()
            );
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(SEND_TIMEOUT)
            .user_agent(concat!("mop-server/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("cannot build the alert webhook's HTTP client")?;
        Ok(Some(Webhook {
            url,
            secret,
            config: config.clone(),
            http,
        }))
    }

    /// The wait before attempt `attempts + 1`: doubling from a second, capped, with up to a
    /// tenth of jitter so many events do not retry in step.
    fn backoff(&self, attempts: u32) -> Duration {
        let secs = 1u64
            .checked_shl(attempts.min(62))
            .unwrap_or(u64::MAX)
            .min(self.config.max_backoff_secs);
        let jitter = fastrand::u64(0..=secs * 100);
        Duration::from_secs(secs) + Duration::from_millis(jitter)
    }

    /// POSTs one event; `Err` names what failed by kind (a status, a refused connection, a
    /// timeout), never the body.
    async fn send(&self, a: &Alert) -> Result<(), String> {
        let answer = self
            .http
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("X-Mop-Event", &a.kind)
            .header(
                "X-Mop-Signature",
                signature(&self.secret, a.body.as_bytes()),
            )
            .body(a.body.clone())
            .send()
            .await;
        match answer {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(format!("status {}", r.status().as_u16())),
            Err(e) if e.is_timeout() => Err("timeout".into()),
            Err(e) if e.is_connect() => Err("connect".into()),
            Err(_) => Err("request".into()),
        }
    }
}

/// Runs the webhook until `stop`: checks the queue every `scan_secs`, sends what is due
/// every second.
pub async fn run(state: Arc<AppState>, hook: Arc<Webhook>, mut stop: watch::Receiver<bool>) {
    let scan_every = Duration::from_secs(hook.config.scan_secs);
    let mut last_scan: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if last_scan.is_none_or(|t| t.elapsed() >= scan_every) {
            last_scan = Some(Instant::now());
            let (store, age, max) = (
                state.store.clone(),
                hook.config.item_age_secs,
                hook.config.max_pending,
            );
            match tokio::task::spawn_blocking(move || store.scan_alerts(age, max)).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => tracing::info!(events = n, "alerts queued for the webhook"),
                Ok(Err(e)) => tracing::warn!(error = %e, "could not check the queue for alerts"),
                Err(e) => tracing::warn!(error = %e, "the alert check panicked"),
            }
        }
        tokio::select! {
            _ = deliver(&state, &hook) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Sends the events due now, one after another.
async fn deliver(state: &Arc<AppState>, hook: &Webhook) {
    let store = state.store.clone();
    let due = match tokio::task::spawn_blocking(move || store.due_alerts(BATCH)).await {
        Ok(Ok(due)) => due,
        Ok(Err(e)) => return tracing::warn!(error = %e, "could not read due alerts"),
        Err(e) => return tracing::warn!(error = %e, "reading due alerts panicked"),
    };
    for a in due {
        let (store, claimed) = (state.store.clone(), a.clone());
        match tokio::task::spawn_blocking(move || store.claim_alert(&claimed, CLAIM_SECS)).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => continue,
            Ok(Err(e)) => return tracing::warn!(error = %e, "could not claim an alert"),
            Err(e) => return tracing::warn!(error = %e, "claiming an alert panicked"),
        }
        let outcome = hook.send(&a).await;
        let attempts = a.attempts + 1;
        match &outcome {
            Ok(()) => tracing::info!(workspace = %a.workspace, kind = %a.kind,
                subject = %a.subject, attempts, "alert delivered"),
            Err(why) => tracing::warn!(workspace = %a.workspace, kind = %a.kind,
                subject = %a.subject, attempts, error = %why, "alert not delivered"),
        }
        let retry = (attempts < hook.config.max_attempts).then(|| {
            let wait = hook.backoff(a.attempts);
            Stamp(Timestamp::now() + (wait.as_millis() as i64).milliseconds())
        });
        let store = state.store.clone();
        let record = move || {
            let outcome = match &outcome {
                Ok(()) => Ok(()),
                Err(why) => Err((why.as_str(), retry)),
            };
            store.alert_attempted(&a, outcome)
        };
        if let Ok(Err(e)) = tokio::task::spawn_blocking(record).await {
            tracing::warn!(error = %e, "could not record an alert's delivery");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_of_the_body() {
        // RFC 4231 test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
