//! Content codings of the sync answers (manifests and object batches, the only large
//! bodies): which one a client accepts, and compressing with it.
//!
//! zstd is preferred to gzip when a client takes both: for the 33 MB of a 10k-card cold
//! sync, zstd at level 1 compressed in a quarter of gzip's (level 1) time and decompressed
//! in a fifth, to a smaller body, and both the server and the daemon pay for it on the
//! same cores as everything else (measured with the `gzip` and `zstd` tools on the
//! benchmark's cards; see bench/NOTES.md).

use axum::http::{HeaderMap, HeaderValue, header};
use bytes::Bytes;

/// Bodies shorter than this are sent as they are: compressing them saves next to nothing.
pub(crate) const MIN_BYTES: usize = 1024;

/// zstd's level: its fastest regular one, which already beats gzip's level 1 on size.
const ZSTD_LEVEL: i32 = 1;

/// A content coding the server can send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Coding {
    /// Uncompressed.
    #[default]
    Identity,
    /// gzip (RFC 1952).
    Gzip,
    /// zstd (RFC 8878).
    Zstd,
}

impl Coding {
    /// The coding to answer with: zstd if the request's `Accept-Encoding` allows it, else
    /// gzip if it allows that, else none. A coding listed with `q=0` is refused.
    pub fn negotiate(headers: &HeaderMap) -> Coding {
        let (mut gzip, mut zstd) = (false, false);
        for coding in headers
            .get_all(header::ACCEPT_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
        {
            let mut parts = coding.trim().split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| matches!(p.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000"));
            if refused {
                continue;
            }
            gzip |= name.eq_ignore_ascii_case("gzip");
            zstd |= name.eq_ignore_ascii_case("zstd");
        }
        match (zstd, gzip) {
            (true, _) => Coding::Zstd,
            (false, true) => Coding::Gzip,
            (false, false) => Coding::Identity,
        }
    }

    /// This coding, unless `len` bytes are too few to be worth compressing.
    pub fn for_len(self, len: usize) -> Coding {
        if len < MIN_BYTES {
            Coding::Identity
        } else {
            self
        }
    }

    /// The `Content-Encoding` value, if any.
    pub fn header(self) -> Option<HeaderValue> {
        match self {
            Coding::Identity => None,
            Coding::Gzip => Some(HeaderValue::from_static("gzip")),
            Coding::Zstd => Some(HeaderValue::from_static("zstd")),
        }
    }

    /// `data` in this coding.
    pub fn encode(self, data: &[u8]) -> Bytes {
        use std::io::Write;
        match self {
            Coding::Identity => Bytes::copy_from_slice(data),
            Coding::Gzip => {
                let mut enc = flate2::write::GzEncoder::new(
                    Vec::with_capacity(data.len() / 4),
                    flate2::Compression::fast(),
                );
                enc.write_all(data).expect("writing to a Vec cannot fail");
                Bytes::from(enc.finish().expect("writing to a Vec cannot fail"))
            }
            Coding::Zstd => Bytes::from(
                zstd::bulk::compress(data, ZSTD_LEVEL).expect("compressing into memory"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn zstd_is_preferred_and_q_zero_refuses() {
        assert_eq!(Coding::negotiate(&with(&[])), Coding::Identity);
        assert_eq!(Coding::negotiate(&with(&["gzip"])), Coding::Gzip);
        assert_eq!(Coding::negotiate(&with(&["gzip, zstd"])), Coding::Zstd);
        assert_eq!(
            Coding::negotiate(&with(&["br", "ZSTD;q=0.5"])),
            Coding::Zstd
        );
        assert_eq!(Coding::negotiate(&with(&["gzip, zstd;q=0"])), Coding::Gzip);
        assert_eq!(Coding::negotiate(&with(&["gzip;q=0"])), Coding::Identity);
        assert_eq!(Coding::Zstd.for_len(10), Coding::Identity);
    }

    #[test]
    fn both_codings_round_trip() {
        use std::io::Read;
        let data = "a card body, repeated. ".repeat(500);
        let z = Coding::Zstd.encode(data.as_bytes());
        assert_eq!(zstd::decode_all(&z[..]).unwrap(), data.as_bytes());
        let g = Coding::Gzip.encode(data.as_bytes());
        let mut back = String::new();
        flate2::read::GzDecoder::new(&g[..])
            .read_to_string(&mut back)
            .unwrap();
        assert_eq!(back, data);
        assert!(z.len() < data.len() / 10 && g.len() < data.len() / 10);
    }
}
