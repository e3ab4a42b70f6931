//! The native runtime's in-sandbox init.
//!
//! [`plan`] is its input format (the types only: `smithers-runtime-native` compiles them).

pub mod plan;
