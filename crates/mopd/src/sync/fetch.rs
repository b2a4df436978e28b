//! The fetcher: the objects a plan needs, from the server into the pool. Bodies stream
//! from [`crate::client`] through [`mop_proto::sync::BatchDecoder`] (for batches) into the
//! pool's [`ObjectWriter`]s, which verify each object's size and hash before naming it.
//! The answer must hold exactly the objects asked for, in the order asked. Each object,
//! once named, goes with its bytes to the generation being built from them (a [`Feed`]).

use mop_proto::sync::{BatchDecoder, BatchError, BatchSink};

use crate::client::{CardServer, ClientError};
use crate::pool::{Arrived, Feed, ObjectWriter, Pool, PoolError};

/// Objects per batch request.
const BATCH: usize = 500;
/// Below this many missing objects, fetch them one by one.
const BATCH_THRESHOLD: usize = 4;
/// No card file is larger (64 KiB of body plus frontmatter), with room to spare.
const MAX_OBJECT: u64 = 1024 * 1024;

/// Why objects could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Talking to the server failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The pool could not take an object (or it failed verification).
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The batch answer is malformed.
    #[error("bad response: {0}")]
    Batch(#[from] BatchError),
    /// The answer holds other objects than asked for, or other sizes.
    #[error("bad response: object batch: {0}")]
    Unexpected(String),
    /// The server no longer has an object the manifest named (it changed meanwhile).
    #[error("object {0} is no longer on the server; the manifest will be fetched again")]
    Gone(String),
}

/// Fetches `wanted` (sha256, size) into the pool, handing each object to `feed` once it
/// is named there; returns the bytes received.
pub async fn fetch(
    client: &dyn CardServer,
    pool: &Pool,
    ws: &str,
    wanted: &[(String, u64)],
    feed: &Feed,
) -> Result<u64, FetchError> {
    let mut received = 0;
    if wanted.len() < BATCH_THRESHOLD {
        for (sha, size) in wanted {
            let mut body = client.object(ws, sha).await?;
            let mut writer = pool.new_object(sha, *size)?;
            while let Some(chunk) = body.chunk().await? {
                received += chunk.len() as u64;
                writer.write(&chunk)?;
            }
            let bytes = writer.finish()?;
            let sha256 = sha.clone();
            feed.hand_over(vec![Arrived { sha256, bytes }]).await?;
        }
        return Ok(received);
    }
    type Answer<'f> = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<crate::client::Body, ClientError>> + Send + 'f>,
    >;
    let request = |chunk: &[(String, u64)]| -> Answer<'_> {
        Box::pin(client.object_batch(ws, chunk.iter().map(|(s, _)| s.clone()).collect()))
    };
    // One request ahead: the server reads and compresses the next batch while this one
    // is decoded, hashed and written (each side would otherwise wait for the other).
    let chunks: Vec<&[(String, u64)]> = wanted.chunks(BATCH).collect();
    let mut next = Some(request(chunks[0]));
    for (i, chunk) in chunks.iter().enumerate() {
        let body = next.take().expect("a request is in flight").await?;
        let mut ahead = chunks.get(i + 1).map(|c| request(c));
        let store = store_batch(pool, chunk, body, feed);
        tokio::pin!(store);
        // The next request is driven only until its answer starts (its headers): its body
        // waits in the connection until this batch is stored.
        let mut answered = None;
        let stored = loop {
            tokio::select! {
                stored = &mut store => break stored,
                got = async { ahead.as_mut().expect("checked").await }, if ahead.is_some() && answered.is_none() => {
                    answered = Some(got);
                    ahead = None;
                }
            }
        };
        received += stored?;
        next = match (answered, ahead) {
            (Some(got), _) => Some(Box::pin(std::future::ready(got)) as Answer<'_>),
            (None, Some(pending)) => Some(pending),
            (None, None) => None,
        };
    }
    Ok(received)
}

/// Decodes one batch answer into the pool; returns the bytes received.
async fn store_batch(
    pool: &Pool,
    chunk: &[(String, u64)],
    mut body: crate::client::Body,
    feed: &Feed,
) -> Result<u64, FetchError> {
    let mut received = 0;
    let mut decoder = BatchDecoder::new(MAX_OBJECT);
    let mut sink = PoolSink::new(pool, chunk);
    while let Some(bytes) = body.chunk().await? {
        received += bytes.len() as u64;
        decoder.feed(&bytes, &mut sink)?;
        // Those of one network read together: one wake-up of the build's thread each.
        feed.hand_over(std::mem::take(&mut sink.named)).await?;
    }
    decoder.finish()?;
    sink.finish()?;
    Ok(received)
}

/// A batch's objects, written into the pool as they are decoded.
struct PoolSink<'a> {
    pool: &'a Pool,
    wanted: &'a [(String, u64)],
    next: usize,
    /// The object being written.
    writer: Option<ObjectWriter>,
    /// Objects named in the pool, to hand to the build.
    named: Vec<Arrived>,
}

impl<'a> PoolSink<'a> {
    fn new(pool: &'a Pool, wanted: &'a [(String, u64)]) -> Self {
        PoolSink {
            pool,
            wanted,
            next: 0,
            writer: None,
            named: Vec::new(),
        }
    }

    /// The next object asked for, which `sha256` must be.
    fn expect(&mut self, sha256: &str) -> Result<u64, FetchError> {
        let Some((want, size)) = self.wanted.get(self.next) else {
            return Err(FetchError::Unexpected("more objects than requested".into()));
        };
        if sha256 != want {
            return Err(FetchError::Unexpected(format!(
                "expected object {want}, got {sha256}"
            )));
        }
        self.next += 1;
        Ok(*size)
    }

    fn finish(&self) -> Result<(), FetchError> {
        if self.next != self.wanted.len() {
            return Err(FetchError::Unexpected(format!(
                "cut short after {} of {} objects",
                self.next,
                self.wanted.len()
            )));
        }
        Ok(())
    }
}

impl BatchSink for PoolSink<'_> {
    type Error = FetchError;

    fn begin(&mut self, sha256: &str, size: u64) -> Result<(), FetchError> {
        let want = self.expect(sha256)?;
        if size != want {
            return Err(FetchError::Unexpected(format!(
                "object {sha256} has {size} bytes, the manifest says {want}"
            )));
        }
        self.writer = Some(self.pool.new_object(sha256, size)?);
        Ok(())
    }

    fn data(&mut self, chunk: &[u8]) -> Result<(), FetchError> {
        let writer = self.writer.as_mut().expect("data follows begin");
        Ok(writer.write(chunk)?)
    }

    fn end(&mut self) -> Result<(), FetchError> {
        let writer = self.writer.take().expect("end follows begin");
        let bytes = writer.finish()?;
        let sha256 = self.wanted[self.next - 1].0.clone();
        self.named.push(Arrived { sha256, bytes });
        Ok(())
    }

    fn missing(&mut self, sha256: &str) -> Result<(), FetchError> {
        self.expect(sha256)?;
        Err(FetchError::Gone(sha256.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mop_proto::sync::encode_batch_item;

    fn pool(dir: &std::path::Path) -> Pool {
        Pool::open(&crate::paths::Paths::under(dir), "acme").unwrap()
    }

    fn decode_into(pool: &Pool, wanted: &[(String, u64)], answer: &[u8]) -> Result<(), FetchError> {
        let mut decoder = BatchDecoder::new(MAX_OBJECT);
        let mut sink = PoolSink::new(pool, wanted);
        // In two pieces, split inside the first object.
        let split = answer.len().min(70);
        decoder.feed(&answer[..split], &mut sink)?;
        decoder.feed(&answer[split..], &mut sink)?;
        decoder.finish()?;
        sink.finish()
    }

    #[test]
    fn a_batch_lands_in_the_pool_verified_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let pool = pool(dir.path());
        let bodies: [&[u8]; 2] = [b"first card\n", b"second\ncard\n"];
        let wanted: Vec<(String, u64)> = bodies
            .iter()
            .map(|b| (mop_cards::sha256_hex(b), b.len() as u64))
            .collect();
        let mut answer = Vec::new();
        for (b, (sha, _)) in bodies.iter().zip(&wanted) {
            encode_batch_item(&mut answer, sha, Some(b));
        }
        decode_into(&pool, &wanted, &answer).unwrap();
        for (sha, size) in &wanted {
            assert!(pool.has_object(sha, *size));
        }

        // Out of order, a flipped byte, a missing object, one object short.
        let mut swapped = Vec::new();
        encode_batch_item(&mut swapped, &wanted[1].0, Some(bodies[1]));
        encode_batch_item(&mut swapped, &wanted[0].0, Some(bodies[0]));
        assert!(matches!(
            decode_into(&pool, &wanted, &swapped),
            Err(FetchError::Unexpected(_))
        ));
        let mut flipped = Vec::new();
        encode_batch_item(&mut flipped, &wanted[0].0, Some(b"first carD\n"));
        assert!(matches!(
            decode_into(&pool, &wanted[..1], &flipped),
            Err(FetchError::Pool(PoolError::Verify { .. }))
        ));
        let mut gone = Vec::new();
        encode_batch_item(&mut gone, &wanted[0].0, None);
        assert!(matches!(
            decode_into(&pool, &wanted[..1], &gone),
            Err(FetchError::Gone(_))
        ));
        let mut short = Vec::new();
        encode_batch_item(&mut short, &wanted[0].0, Some(bodies[0]));
        assert!(matches!(
            decode_into(&pool, &wanted, &short),
            Err(FetchError::Unexpected(_))
        ));
    }
}
