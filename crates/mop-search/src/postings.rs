//! Posting lists on disk: each term's (document, term frequency) pairs in document order.
//!
//! A list is cut into blocks of [`BLOCK`] pairs, each bit-packed (the `bitpacking` crate's
//! four-lane packer, as Lucene and tantivy do): a header of the block's last document and
//! the two bit widths, the gaps between documents, then the frequencies less one. Scoring
//! decodes a block at a time into two arrays, and a seek steps over whole blocks by their
//! headers without decoding them. The pairs after the last full block (most lists are
//! shorter than one) are variable-length integers: the gap shifted left once, its low bit
//! set when the frequency is 1, else followed by the frequency.
//!
//! Nothing read from a list is trusted: a damaged file makes [`ListReader`] return
//! [`Damaged`], never panic or read outside the list's bytes.

use bitpacking::{BitPacker, BitPacker4x};

/// Pairs per bit-packed block.
pub(crate) const BLOCK: usize = BitPacker4x::BLOCK_LEN;

/// Bytes of a block's header: its last document (u32) and the two bit widths.
const HEADER: usize = 6;

/// A posting list's bytes do not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Damaged;

/// Appends the encoding of `docs` (strictly increasing) and their frequencies (each at
/// least 1) to `out`.
pub(crate) fn encode(docs: &[u32], tfs: &[u32], out: &mut Vec<u8>) {
    debug_assert_eq!(docs.len(), tfs.len());
    let packer = BitPacker4x::new();
    let mut minus_one = [0u32; BLOCK];
    let mut scratch = [0u8; 4 * BLOCK];
    let mut previous: Option<u32> = None;
    let full = docs.len() / BLOCK * BLOCK;
    for (block, freqs) in docs[..full]
        .chunks_exact(BLOCK)
        .zip(tfs.chunks_exact(BLOCK))
    {
        for (m, tf) in minus_one.iter_mut().zip(freqs) {
            *m = tf - 1;
        }
        let doc_bits = packer.num_bits_strictly_sorted(previous, block);
        let tf_bits = packer.num_bits(&minus_one);
        let last = block[BLOCK - 1];
        out.extend_from_slice(&last.to_le_bytes());
        out.extend_from_slice(&[doc_bits, tf_bits]);
        let n = packer.compress_strictly_sorted(previous, block, &mut scratch, doc_bits);
        out.extend_from_slice(&scratch[..n]);
        let n = packer.compress(&minus_one, &mut scratch, tf_bits);
        out.extend_from_slice(&scratch[..n]);
        previous = Some(last);
    }
    let mut last = previous.unwrap_or(0);
    for (&doc, &tf) in docs[full..].iter().zip(&tfs[full..]) {
        let gap = doc - last;
        last = doc;
        if tf == 1 {
            put_vint(out, (gap << 1) | 1);
        } else {
            put_vint(out, gap << 1);
            put_vint(out, tf);
        }
    }
}

/// Appends `v` as a variable-length integer (7 bits a byte, low bits first).
pub(crate) fn put_vint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads a variable-length integer at `*at`, moving past it.
pub(crate) fn get_vint(bytes: &[u8], at: &mut usize) -> Result<u32, Damaged> {
    let mut v: u32 = 0;
    for shift in (0..35).step_by(7) {
        let b = *bytes.get(*at).ok_or(Damaged)?;
        *at += 1;
        v |= u32::from(b & 0x7f).checked_shl(shift).ok_or(Damaged)?;
        if b < 0x80 {
            return Ok(v);
        }
    }
    Err(Damaged)
}

/// Decodes one posting list, a block at a time.
pub(crate) struct ListReader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Pairs not yet decoded.
    left: usize,
    /// The last document decoded (or stepped over).
    last: Option<u32>,
}

impl<'a> ListReader<'a> {
    /// The list of `len` pairs starting at `bytes[0]` (`bytes` may run past its end).
    pub(crate) fn new(bytes: &'a [u8], len: usize) -> ListReader<'a> {
        ListReader {
            bytes,
            at: 0,
            left: len,
            last: None,
        }
    }

    /// Pairs not yet decoded.
    pub(crate) fn left(&self) -> usize {
        self.left
    }

    /// The header of the block at the read position: last document, and its size.
    fn block_header(&self) -> Result<(u32, u8, u8, usize), Damaged> {
        let h = self.bytes.get(self.at..self.at + HEADER).ok_or(Damaged)?;
        let last = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let (doc_bits, tf_bits) = (h[4], h[5]);
        if doc_bits > 32 || tf_bits > 32 {
            return Err(Damaged);
        }
        let size = HEADER
            + BitPacker4x::compressed_block_size(doc_bits)
            + BitPacker4x::compressed_block_size(tf_bits);
        if self.at + size > self.bytes.len() {
            return Err(Damaged);
        }
        Ok((last, doc_bits, tf_bits, size))
    }

    /// Decodes the next pairs (a block, or the tail) into `docs` and `tfs`; returns how
    /// many (0 at the end of the list).
    pub(crate) fn next_block(
        &mut self,
        docs: &mut [u32; BLOCK],
        tfs: &mut [u32; BLOCK],
    ) -> Result<usize, Damaged> {
        if self.left >= BLOCK {
            let (last, doc_bits, tf_bits, size) = self.block_header()?;
            let packer = BitPacker4x::new();
            let body = &self.bytes[self.at + HEADER..self.at + size];
            let n = packer.decompress_strictly_sorted(self.last, body, docs, doc_bits);
            packer.decompress(&body[n..], tfs, tf_bits);
            for tf in tfs.iter_mut() {
                *tf = tf.wrapping_add(1);
            }
            if docs[BLOCK - 1] != last {
                return Err(Damaged);
            }
            self.at += size;
            self.left -= BLOCK;
            self.last = Some(last);
            return Ok(BLOCK);
        }
        let n = self.left;
        let mut doc = self.last.unwrap_or(0);
        for i in 0..n {
            let v = get_vint(self.bytes, &mut self.at)?;
            doc = doc.checked_add(v >> 1).ok_or(Damaged)?;
            docs[i] = doc;
            tfs[i] = if v & 1 == 1 {
                1
            } else {
                get_vint(self.bytes, &mut self.at)?
            };
        }
        self.left = 0;
        self.last = Some(doc);
        Ok(n)
    }

    /// Steps over the whole blocks that end before document `target` without decoding
    /// them, so that the next [`ListReader::next_block`] holds `target` if the list does.
    pub(crate) fn skip_before(&mut self, target: u32) -> Result<(), Damaged> {
        while self.left >= BLOCK {
            let (last, _, _, size) = self.block_header()?;
            if last >= target {
                break;
            }
            self.at += size;
            self.left -= BLOCK;
            self.last = Some(last);
        }
        Ok(())
    }
}

/// The frequency of each of `targets` (strictly increasing documents) in a list, as
/// (index into `targets`, frequency) for those it holds. Blocks before the next target are
/// stepped over by their headers; in a decoded block each target is found by binary
/// search (targets are few next to a common term's postings).
pub(crate) fn frequencies_of(
    mut list: ListReader<'_>,
    targets: &[u32],
) -> Result<Vec<(u32, u32)>, Damaged> {
    let mut found = Vec::new();
    let (mut docs, mut tfs) = ([0u32; BLOCK], [0u32; BLOCK]);
    let mut t = 0;
    while t < targets.len() && list.left() > 0 {
        list.skip_before(targets[t])?;
        let n = list.next_block(&mut docs, &mut tfs)?;
        let block = &docs[..n];
        let Some(&last) = block.last() else {
            break;
        };
        let mut i = 0;
        while let Some(&target) = targets.get(t).filter(|&&d| d <= last) {
            i += block[i..].partition_point(|&d| d < target);
            if block.get(i) == Some(&target) {
                found.push((t as u32, tfs[i]));
                i += 1;
            }
            t += 1;
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8], len: usize) -> Result<(Vec<u32>, Vec<u32>), Damaged> {
        let mut r = ListReader::new(bytes, len);
        let (mut d, mut t) = ([0u32; BLOCK], [0u32; BLOCK]);
        let (mut docs, mut tfs) = (Vec::new(), Vec::new());
        loop {
            let n = r.next_block(&mut d, &mut t)?;
            if n == 0 {
                return Ok((docs, tfs));
            }
            docs.extend_from_slice(&d[..n]);
            tfs.extend_from_slice(&t[..n]);
        }
    }

    fn list(len: usize, seed: u32) -> (Vec<u32>, Vec<u32>) {
        let mut doc = seed % 3;
        let mut docs = Vec::new();
        let mut tfs = Vec::new();
        for i in 0..len as u32 {
            docs.push(doc);
            doc += 1 + (i.wrapping_mul(2654435761) >> 27) * (1 + seed % 5);
            tfs.push(if i % 3 == 0 {
                1
            } else {
                1 + (i * 7 + seed) % 40
            });
        }
        (docs, tfs)
    }

    #[test]
    fn lists_of_every_shape_round_trip_and_seek() {
        for len in [0, 1, 2, 127, 128, 129, 255, 256, 300, 1000] {
            for seed in 0..4 {
                let (docs, tfs) = list(len, seed);
                let mut bytes = Vec::new();
                encode(&docs, &tfs, &mut bytes);
                // Trailing bytes of the next list do not disturb this one.
                bytes.extend_from_slice(&[0xff; 40]);
                assert_eq!(decode(&bytes, len).unwrap(), (docs.clone(), tfs.clone()));
                // Frequencies of every third document, of absent ones, and past the end.
                let mut targets: Vec<u32> = docs.iter().step_by(3).copied().collect();
                targets.extend(docs.last().map(|d| d + 5));
                let found = frequencies_of(ListReader::new(&bytes, len), &targets).unwrap();
                let expect: Vec<(u32, u32)> = (0..docs.len())
                    .step_by(3)
                    .enumerate()
                    .map(|(t, i)| (t as u32, tfs[i]))
                    .collect();
                assert_eq!(found, expect, "len {len} seed {seed}");
                let gaps: Vec<u32> = docs.iter().map(|d| d + 1).collect();
                let odd = frequencies_of(ListReader::new(&bytes, len), &gaps).unwrap();
                assert!(odd.iter().all(|(t, _)| docs.contains(&gaps[*t as usize])));
            }
        }
    }

    #[test]
    fn damaged_lists_are_errors_not_panics() {
        let (docs, tfs) = list(300, 1);
        let mut bytes = Vec::new();
        encode(&docs, &tfs, &mut bytes);
        for cut in [0, 3, 6, 50, bytes.len() - 1] {
            assert_eq!(decode(&bytes[..cut], 300), Err(Damaged), "cut at {cut}");
        }
        let mut wide = bytes.clone();
        wide[4] = 40;
        assert_eq!(decode(&wide, 300), Err(Damaged));
        let mut wrong_last = bytes.clone();
        wrong_last[0] ^= 1;
        assert_eq!(decode(&wrong_last, 300), Err(Damaged));
        // Garbage of every length decodes to an error or to something, never a panic.
        for len in 0..300 {
            let _ = decode(&[0x80; 64], len);
            let _ = decode(&[0x07; 64], len);
        }
    }
}
