//! One module per command group.

pub mod backend;
pub mod bundle;
pub(crate) mod changes;
pub mod context;
pub mod daemon;
pub mod doctor;
pub mod egress;
pub(crate) mod egress_summary;
pub(crate) mod flags;
pub mod home;
pub mod inspect;
pub mod mcp;
pub mod mounts;
mod progress;
pub mod remove;
pub mod review;
pub mod run;
mod run_args;
mod run_row;
mod run_summary;
pub(crate) mod run_terminal;
pub mod serve;
pub mod session;
