//! Between the HTTP handlers and the store: what a request means. A handler parses a
//! request and answers it; the store reads and writes rows inside one transaction; the
//! rules (scope, trust, the same lesson, rejections, limits, and what a curator's action
//! may do to a card) are decided here, in the transaction the store opens, so a decision
//! and its change commit together.

pub mod curation;
pub mod import;
pub mod memories;
