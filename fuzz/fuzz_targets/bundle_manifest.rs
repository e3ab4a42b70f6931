//! A bundle's README.md: the manifest (JavaScript semantics) and our changeNotes key.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = smithers_bundle::parse_manifest(data) {
        let _ = m.diff_bundle();
    }
    let _ = smithers_bundle::parse_change_notes(data);
});
