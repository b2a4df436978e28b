//! The one memory map: an index file read in place, so a daemon holding many generations
//! keeps in memory only the pages its searches touch.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;

/// A file mapped read-only.
pub(crate) struct Map(memmap2::Mmap);

impl Map {
    /// Maps all of `file`.
    pub(crate) fn of(file: &File) -> io::Result<Map> {
        // SAFETY: index files are written once, inside a generation (or a server's own
        // temporary directory) that nothing writes to again: a new index is always a new
        // file, so the bytes cannot change under the map. A file cut short by someone with
        // write access to the cache would fault on a read past its new end, which is the
        // exposure every memory-mapped index (tantivy's included) accepts; every offset
        // read from the file is checked against the length it had when it was opened.
        let map = unsafe { memmap2::Mmap::map(file)? };
        Ok(Map(map))
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}
