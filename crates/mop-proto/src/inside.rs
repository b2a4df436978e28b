//! Where things appear inside a task's sandbox. The runner binds them there and the tools
//! an agent runs (`mop memory`, `mop mcp`) expect them there, so the names live once.
//!
//! Everything is under the sandbox's own `/run` (a tmpfs bubblewrap makes), where no
//! writer of the working directory can replace it.

/// The agent socket's file name inside its directory (on the host and in the sandbox).
pub const AGENT_SOCKET_NAME: &str = "agent.sock";

/// The task's index file at the top of its view.
pub const MEMORY_MD_NAME: &str = "MEMORY.md";

/// The agent socket's directory.
pub const AGENT_DIR: &str = "/run/mop/agent";

/// The agent socket (`MOP_AGENT_SOCKET`).
pub const AGENT_SOCKET: &str = "/run/mop/agent/agent.sock";

/// The task's memory view, read-only (`MOP_MEMORY_DIR`). It is also mounted at the
/// profile's `memory_dir` inside the working directory, where agents look by habit.
pub const MEMORY_DIR: &str = "/run/mop/memory";

/// The task's index (`MOP_MEMORY_MD`).
pub const MEMORY_MD: &str = "/run/mop/memory/MEMORY.md";

/// Where `mop memory get --save` writes copies of cards (`MOP_SAVED_DIR`): the sandbox's
/// own tmpfs, gone when the task ends. No saved copy outlives its task, so none found in a
/// working directory (`.memory/`, where copies used to go) is one mop made.
pub const SAVED_DIR: &str = "/run/mop/saved";

/// The directory of the `mop` binary the runner binds in (first on `PATH`).
pub const BIN_DIR: &str = "/run/mop/bin";

/// `mop` itself, as agent configurations name it.
pub const MOP: &str = "/run/mop/bin/mop";

/// The sandbox-private home of a primed agent (`--agent claude|codex`): a tmpfs that
/// holds what the adapter wrote and whatever the agent writes, gone when the task ends.
pub const HOME: &str = "/run/mop/home";

/// Where an agent CLI's own memory goes when `mop run` captures it (Claude Code's
/// `autoMemoryDirectory`): a directory `mop run` made for the task, read when the task
/// ends and then removed.
pub const CAPTURE_DIR: &str = "/run/mop/capture";

/// The names of the environment variables a task's sandbox carries. The runner sets them
/// (`mop run`, `mop prepare --print-env`, the agent adapters) and the tools inside read
/// them, so each name is spelled once.
pub mod env {
    /// The agent socket's path.
    pub const AGENT_SOCKET: &str = "MOP_AGENT_SOCKET";
    /// The task's id.
    pub const TASK_ID: &str = "MOP_TASK_ID";
    /// The working directory as the sandbox sees it.
    pub const WORKDIR: &str = "MOP_WORKDIR";
    /// The task's memory view.
    pub const MEMORY_DIR: &str = "MOP_MEMORY_DIR";
    /// The task's `MEMORY.md`.
    pub const MEMORY_MD: &str = "MOP_MEMORY_MD";
    /// Where `mop memory get --save` writes.
    pub const SAVED_DIR: &str = "MOP_SAVED_DIR";
    /// The task's user, a hint for stores (the lease decides).
    pub const TASK_USER: &str = "MOP_TASK_USER";
    /// The task's asset, a hint for stores (the lease decides).
    pub const TASK_ASSET: &str = "MOP_TASK_ASSET";
    /// The task's project, a hint for stores (the lease decides).
    pub const TASK_PROJECT: &str = "MOP_TASK_PROJECT";
}
