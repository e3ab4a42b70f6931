//! Issue 13: "a binary patch header sizes an allocation unchecked: a 300-byte patch aborts
//! accept, review and bundle validate" (all of which parse the bundle's patches with
//! `parse_patch`). This test binary has its own allocator, which records the largest single
//! allocation and refuses any over 1 GiB, so code that sizes a buffer by a hostile header
//! aborts here on every machine instead of depending on the host's overcommit.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use smithers_patch::*;

struct Tracking;

static LARGEST: AtomicUsize = AtomicUsize::new(0);
const REFUSED_ABOVE: usize = 1 << 30;

fn record(size: usize) -> bool {
    LARGEST.fetch_max(size, Ordering::Relaxed);
    size <= REFUSED_ABOVE
}

// SAFETY: every call is forwarded unchanged to the system allocator (or refused with null,
// which the GlobalAlloc contract allows); nothing else is done with the memory.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !record(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout is passed on as it came.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout (alloc/realloc above forward to it).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !record(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: as for dealloc; `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

/// A binary patch whose single hunk header is `header`, carrying a few real deflated bytes.
fn tiny_patch(header: &str) -> String {
    let content = b"\0tiny";
    let honest = FilePatch {
        path: "f.bin".into(),
        old_mode: None,
        new_mode: Some(GitMode::File),
        old_oid: None,
        new_oid: Some(git_blob_oid(content)),
        body: PatchBody::Binary {
            forward: BinaryHunk::Literal(content.to_vec()),
            reverse: None,
        },
    }
    .render();
    let forged = honest.replace("literal 5\n", &format!("{header}\n"));
    assert!(forged.contains(&format!("\n{header}\n")));
    forged
}

#[test]
fn tiny_patches_with_huge_declared_sizes_are_errors_without_big_allocations() {
    for header in [
        // Under the 4 GiB content limit: only the data's real ceiling can refuse to size by it.
        "literal 1000000000",
        "delta 1073741824",
        "literal 1073741825",
        "literal 4000000000",
        // Over the limit, by one byte and by far.
        "literal 4294967297",
        "delta 5000000000",
        // Over the limit, and over every integer type.
        "literal 18446744073709551615",
        "delta 99999999999999999999999",
    ] {
        let patch = tiny_patch(header);
        assert!(patch.len() < 300, "{} bytes", patch.len());
        LARGEST.store(0, Ordering::Relaxed);
        let r = parse_patch(&patch);
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(r.is_err(), "{header}: accepted");
        assert!(largest < 1 << 20, "{header}: allocated {largest} bytes");
    }
    // The honest patch still parses.
    assert!(parse_patch(&tiny_patch("literal 5")).is_ok());
}
