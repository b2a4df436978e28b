//! The body of every error answer, from the card server and from both of mopd's sockets:
//! a stable `error` code, for programs to tell kinds apart (never by the message), and a
//! `message` saying what happened and what to do, for people. Some answers carry more
//! (a credential refusal its findings), beside the two.

use serde::{Deserialize, Serialize};

/// The stable codes of the `error` field that are not about stores (those are in
/// [`crate::sync::store_errors`]).
pub mod codes {
    /// The request is malformed (400).
    pub const BAD_REQUEST: &str = "bad_request";
    /// No credentials, or wrong ones (401).
    pub const UNAUTHORIZED: &str = "unauthorized";
    /// Not this caller's to ask (403).
    pub const FORBIDDEN: &str = "forbidden";
    /// Nothing there, or nothing this caller may see (404).
    pub const NOT_FOUND: &str = "not_found";
    /// It clashes with what is there (409).
    pub const CONFLICT: &str = "conflict";
    /// A version precondition failed: it changed meanwhile (412).
    pub const PRECONDITION_FAILED: &str = "precondition_failed";
    /// Too large (413).
    pub const TOO_LARGE: &str = "too_large";
    /// Not now: busy, starting, or a part it needs is away (503).
    pub const UNAVAILABLE: &str = "unavailable";
    /// A fault of the answering side (500).
    pub const INTERNAL: &str = "internal";

    /// The code for an answer that has no more particular one: by its status.
    pub fn for_status(status: u16) -> &'static str {
        match status {
            400 => BAD_REQUEST,
            401 => UNAUTHORIZED,
            403 => FORBIDDEN,
            404 => NOT_FOUND,
            409 => CONFLICT,
            412 => PRECONDITION_FAILED,
            413 => TOO_LARGE,
            503 => UNAVAILABLE,
            _ => INTERNAL,
        }
    }
}

/// An error answer's body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What kind of error: one of [`codes`] or [`crate::sync::store_errors`].
    pub error: String,
    /// What happened and what to do.
    pub message: String,
    /// What some answers carry beside (a credential refusal's `findings`).
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub details: serde_json::Map<String, serde_json::Value>,
}

impl ErrorBody {
    /// An answer of code `error`.
    pub fn new(error: impl Into<String>, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            error: error.into(),
            message: message.into(),
            details: serde_json::Map::new(),
        }
    }

    /// The body of an error answer, if it is one; else `None` (a proxy's page, say).
    pub fn parse(body: &[u8]) -> Option<ErrorBody> {
        serde_json::from_slice(body).ok()
    }

    /// The message of an error answer of any kind: the body's `message`, else the first
    /// 500 characters of its text.
    pub fn message_of(body: &[u8]) -> String {
        ErrorBody::parse(body).map_or_else(
            || {
                String::from_utf8_lossy(body)
                    .trim()
                    .chars()
                    .take(500)
                    .collect()
            },
            |b| b.message,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_reads_back_with_what_it_carries_beside() {
        let mut b = ErrorBody::new(crate::sync::store_errors::CREDENTIAL, "no");
        b.details
            .insert("findings".into(), serde_json::json!([{"kind": "x"}]));
        let text = serde_json::to_string(&b).unwrap();
        assert_eq!(
            text,
            r#"{"error":"credential","message":"no","findings":[{"kind":"x"}]}"#
        );
        assert_eq!(ErrorBody::parse(text.as_bytes()), Some(b));
        assert_eq!(
            ErrorBody::message_of(b"<html>proxy</html>"),
            "<html>proxy</html>"
        );
        assert_eq!(codes::for_status(404), "not_found");
    }
}
