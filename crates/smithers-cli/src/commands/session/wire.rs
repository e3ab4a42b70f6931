//! The session socket's protocol lives in `smithers_resident::session` (the benchmark speaks it
//! too); re-exported here for the session verbs and the MCP server.

pub use smithers_resident::session::*;
