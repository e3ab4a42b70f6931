//! What a sandbox host (`smithers-server`) and its clients (the `codeplane` runtime of
//! `smithers-runtime-remote`, the TypeScript provider's counterpart, a fleet runtime) exchange,
//! in one crate of its own so that the server depends on no backend and no backend on the
//! server:
//!
//! * [`wire`]: the JSON documents of the API (`openapi/smithers-sandbox.yaml`);
//! * [`archive`]: a tree packed as a streamed tar, and a tar unpacked confined with
//!   [`smithers_paths::Beneath`] (the server for workspaces, clients for bundles);
//! * [`SseParser`]: the event stream (`GET …/events`) read back from arbitrary chunks.
#![forbid(unsafe_code)]

pub mod archive;
pub mod session;
mod sse;
pub mod wire;

pub use sse::{SseFrame, SseParser};
