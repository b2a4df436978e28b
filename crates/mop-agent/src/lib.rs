//! What an agent inside a mop sandbox gets, beyond the files of its view:
//!
//! - [`mcp`]: `mop mcp`, the task's memory as a Model Context Protocol server over stdio,
//!   for agent CLIs (Claude Code, Codex …) that get their tools over MCP;
//! - [`prime`]: the contract text and, per agent CLI, the files it loads on its own
//!   (`CLAUDE.md`, `AGENTS.md`, its MCP configuration), written by `mop run --agent`
//!   into the sandbox's private home.
//!
//! Neither adds rights: the MCP tools are calls on the task's agent socket, under the same
//! scope rules as `mop memory`, and the priming files are text.

pub mod mcp;
pub mod prime;
