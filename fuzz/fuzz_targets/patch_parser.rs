//! The patch parser (text and binary hunks, literal and delta) and everything a review does
//! with what it returns: never a panic, never an unbounded allocation.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(patches) = smithers_patch::parse_patch(text) {
        let _ = smithers_patch::diff_stats(&patches);
        let _ = smithers_patch::render_review(&patches, &Default::default());
        let _ = smithers_patch::review_findings(&patches, &[]);
        let _ = smithers_patch::render_patches(&patches);
    }
});
