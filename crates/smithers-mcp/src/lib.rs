//! The MCP protocol as both of smithers-sandbox's MCP servers speak it: the stdio server of
//! `smithers-sandbox mcp` (sessions of a project on this machine) and the streamable-HTTP
//! endpoint of `serve` (sessions of a host, per token). One protocol, one set of tool
//! schemas, one checking of arguments and one encoding of bytes, so an agent sees the same
//! tools wherever its sandbox runs; what a tool does is each server's.

pub mod args;
pub mod bytes;
pub mod protocol;
pub mod results;
pub mod schema;
pub mod scripts;

pub use args::CallResult;
pub use bytes::Captured;
pub use protocol::{About, Message};
