//! The native runtime's in-sandbox init.
//!
//! [`plan`] is its input format (the types only: `smithers-runtime-native` compiles them).

mod init;
pub mod plan;
pub mod sys;
pub mod zygote;

pub use init::{apply, main, make_mount_point, run};

/// Environment variable naming the init executable (the runtime looks there first).
pub const INIT_ENV: &str = "SMITHERS_SANDBOX_INIT";
