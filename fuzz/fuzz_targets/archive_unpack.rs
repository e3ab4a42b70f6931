//! The upload/bundle archive reader (gzip tar) into a fresh directory, with small limits so
//! that bombs are cut off quickly.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smithers_runtime_remote::archive::{unpack, UnpackLimits};

fuzz_target!(|data: &[u8]| {
    let Ok(dir) = tempfile::tempdir() else {
        return;
    };
    let mut limits = UnpackLimits::bundle();
    limits.max_total_bytes = 1 << 20;
    limits.max_entries = 256;
    let _ = unpack(data, dir.path(), &limits, &|| false);
});
