//! The one timestamp type of the curation and token answers, and the one way a card
//! server writes a time down.
//!
//! A [`Stamp`] is an instant printed as RFC 3339 in UTC with exactly six fractional
//! digits. The fixed width is why it exists: the server stores these strings and compares
//! them as text (SQLite has no timestamp type), and `23.5Z` would sort before `23Z`.
//! Reading accepts any RFC 3339 instant, so a client is never stricter than the server.

use std::fmt;
use std::str::FromStr;

use jiff::Timestamp;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An instant as the card server stores and sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp(pub Timestamp);

impl Stamp {
    /// The current time.
    pub fn now() -> Self {
        Stamp(Timestamp::now())
    }

    /// The instant itself.
    pub fn timestamp(self) -> Timestamp {
        self.0
    }
}

impl From<Timestamp> for Stamp {
    fn from(ts: Timestamp) -> Self {
        Stamp(ts)
    }
}

impl fmt::Display for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const PRINTER: jiff::fmt::temporal::DateTimePrinter =
            jiff::fmt::temporal::DateTimePrinter::new().precision(Some(6));
        // `pad`, so that a width (`{:<28}` in a table) applies as to any string.
        f.pad(&PRINTER.timestamp_to_string(&self.0))
    }
}

/// A text that is not an RFC 3339 instant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an RFC 3339 time (such as 2026-12-06T13:00:00.000000Z)")]
pub struct StampError(pub String);

impl FromStr for Stamp {
    type Err = StampError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<Timestamp>()
            .map(Stamp)
            .map_err(|_| StampError(s.chars().take(64).collect()))
    }
}

impl Serialize for Stamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Stamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_six_digits_so_text_order_is_time_order() {
        let whole: Stamp = "2026-12-06T13:00:23Z".parse().unwrap();
        let half: Stamp = "2026-12-06T13:00:23.5Z".parse().unwrap();
        assert_eq!(whole.to_string(), "2026-12-06T13:00:23.000000Z");
        assert_eq!(half.to_string(), "2026-12-06T13:00:23.500000Z");
        assert!(whole < half);
        assert!(whole.to_string() < half.to_string());
    }

    #[test]
    fn the_wire_form_is_the_printed_form_and_reads_back() {
        let at: Stamp = "2026-12-06T13:00:23.123456Z".parse().unwrap();
        let json = serde_json::to_string(&at).unwrap();
        assert_eq!(json, "\"2026-12-06T13:00:23.123456Z\"");
        assert_eq!(serde_json::from_str::<Stamp>(&json).unwrap(), at);
        let err = serde_json::from_str::<Stamp>("\"yesterday\"").unwrap_err();
        assert!(err.to_string().contains("yesterday"), "{err}");
    }
}
