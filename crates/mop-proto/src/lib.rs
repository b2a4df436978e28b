//! What mop's processes say to each other, defined once:
//!
//! - [`sync`]: card server ↔ daemon: manifest versions, stores from tasks, the object
//!   batch framing and its one (streaming) decoder. The manifest itself is the card
//!   engine's input and lives in `mop-cards`; it is re-exported here.
//! - [`tasks`]: runner → daemon (control socket): prepare, plan, leases, task lists.
//! - [`control`]: the daemon-wide control requests (status, sync, verify, ack-epoch), their
//!   typed answers, and the typed [`control::Control`] client `mop` and `mopd` use.
//! - [`status`]: the versioned status report `mopd status` shows.
//! - [`agent`]: agent → daemon (a task's agent socket): retrieve, get, list, store.
//! - [`receipts`]: what a daemon delivered to each task and what its agent did (ids,
//!   hashes and counts), kept on the host and reported to the card server.
//! - [`curation`]: curator → card server: listings with provenance and usage, the review
//!   queue and its actions, versions, search, the staleness report.
//! - [`profile`]: sandbox profiles, loaded and checked by the daemon (which knows the
//!   directories a profile must never expose) and applied by the runner.
//! - [`host`]: the host facts both sides must agree on (which `bwrap` to trust).
//! - [`inside`]: where things appear inside a task's sandbox.
//! - [`client`]: the small Unix-socket HTTP client under [`control::Control`].
//! - [`error`]: the body of every error answer (a stable code and a message).
//! - [`time`]: the one timestamp type of curation answers, and how the server writes a
//!   time down.

pub mod agent;
pub mod client;
pub mod control;
pub mod curation;
pub mod error;
pub mod host;
pub mod inside;
pub mod profile;
pub mod receipts;
pub mod routes;
pub mod status;
pub mod sync;
pub mod tasks;
pub mod time;

pub use agent::*;
pub use profile::{
    AgentKind, Bind, CaptureSettings, EffectiveLimits, Limits, Profile, ProfileError,
    WorkdirMemory, exposed_by,
};
pub use tasks::*;
