//! The enforcement report of a sandbox that ran, and the host probe (`doctor`).

/// The host probe and its findings.
mod host;
/// What both reports are made of.
mod rows;
/// The report of one execution.
mod step;

pub(crate) use host::{findings, overlay_check, probe, OverlayCheck};
pub use rows::protection_names;
pub(crate) use step::enforcement;
