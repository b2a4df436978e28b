//! The mop host daemon. Data flows one way: server → [`sync`] → [`pool`] → [`tasks`]
//! (views) → the sandbox; see ARCHITECTURE.md for the picture.
//!
//! - [`config`]: `mopd.toml`, validated, reloadable; [`paths`]: every path under the
//!   cache, state and runtime directories; [`files`]: directories and whole-file writes
//!   made one way; [`state`]: the one daemon state.
//! - [`client`]: the card server's protocol, client side (conditional and delta
//!   manifests, object streams); it knows nothing of the pool.
//! - [`sync`]: per workspace, a pure plan (manifest + pool → what to fetch and publish)
//!   and a fetcher writing through the pool's object sink; [`workspaces`]: the sync loops.
//! - [`pool`]: one workspace's verified cache: objects, generations, collection.
//! - [`tasks`]: task projection: leases, views, the reaper; [`embedding`]: the dense
//!   ranker's model, shared by builds and loaded generations.
//! - [`receipts`]: what each task was delivered and what its agent did, kept on the host
//!   and reported to the server.
//! - [`spool`]: agents' stores the server cannot take now, kept on disk and sent exactly
//!   once (by idempotency key) when it can.
//! - [`agent`]: what a task's agent may ask of memory (list, read, retrieve, store),
//!   decided in one place; [`sockets`]: the control socket and each task's agent socket
//!   over one checked listener, translating HTTP to the decisions.
//! - [`status`]: the status report, assembled, judged and rendered; [`metrics`]: the
//!   Prometheus metrics (served by `sockets::metrics` when configured).
//! - [`sys`]: pidfds and allocator calls, the only system calls safe Rust lacks here.
//! - [`daemon`]: `mopd run`, orchestration only. (`mopd demo`, the whole system in a
//!   temporary directory, is the binary's own module: it is no part of the daemon.)

pub(crate) mod agent;
pub mod client;
pub mod config;
pub mod daemon;
pub(crate) mod embedding;
pub(crate) mod files;
pub(crate) mod metrics;
pub mod paths;
pub mod pool;
pub(crate) mod receipts;
pub(crate) mod sockets;
pub(crate) mod spool;
pub mod state;
pub mod status;
pub mod sync;
pub mod sys;
pub(crate) mod tasks;
pub(crate) mod workspaces;
