//! Helpers shared by the integration tests of this crate. Each test binary compiles this
//! module and uses a part of it, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod native;
pub mod ray;
pub mod serve;
