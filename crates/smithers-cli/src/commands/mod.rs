//! One module per command group.

pub mod bundle;
pub mod context;
pub mod daemon;
pub mod doctor;
pub mod egress;
pub(crate) mod egress_summary;
pub mod inspect;
pub mod mounts;
pub mod remove;
pub mod review;
pub mod run;
mod run_row;
pub mod serve;
