//! The mop host daemon.
//!
//! - [`config`]: `mopd.toml`, validated, reloadable.
//! - [`pool`]: one workspace's verified cache pool: objects, generations, the atomic
//!   `current` swap, garbage collection, re-hashing.
//! - [`client`]: the protocol's client side (conditional and delta manifests, objects
//!   verified while they stream).
//! - [`sync`]: the per-workspace sync loop with backoff, rollback refusal and epoch checks.
//! - [`status`]: the versioned status report and its rendering for `mopd status`.
//! - [`control`]: the control socket (server and client); [`http`]: what it shares with
//!   the agent sockets (JSON errors, the request size limit).
//! - [`tasks`]: task projection: views, leases, pins; [`agent`]: each task's agent socket.
//! - [`sys`]: pidfds, the only system calls safe Rust lacks here.
//! - [`daemon`]: `mopd run`.
//! - [`demo`]: `mopd demo`, the whole system in a temporary directory.

pub mod agent;
pub mod client;
pub mod config;
pub mod control;
pub mod daemon;
pub mod demo;
pub mod http;
pub mod pool;
pub mod shared;
pub mod status;
pub mod sync;
pub mod sys;
pub mod tasks;
