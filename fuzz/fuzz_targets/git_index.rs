//! A project's `.git/index` (versions 2-4, SHA-1 and SHA-256 ids): read at collect to tell
//! tracked files from untracked ones, and written by whoever controls the project tree.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = smithers_patch::parse_git_index(data, false);
    let _ = smithers_patch::parse_git_index(data, true);
});
