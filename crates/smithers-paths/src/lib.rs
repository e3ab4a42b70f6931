//! Confinement of untrusted paths (spec section 3).
//!
//! Every path that comes from inside a sandbox — patch paths, artifact paths, result files,
//! entries of an uploaded archive — is untrusted. Three tools, from cheapest to strongest:
//!
//! * [`resolve`]: lexical. Joins and normalises `.`/`..` without touching the disk and checks
//!   the result is the root or beneath it, comparing path **components** (so root `/` works and
//!   `patches/..x.patch` is a legal name). Same contract as the JavaScript
//!   `resolveSandboxPath`, minus its string-prefix bug.
//! * [`assert_within_root`]: symlink-aware check of an existing or not-yet-existing path, by
//!   resolving the real path of its nearest existing ancestor. Good for a one-off check; racy
//!   against a tree that changes under you.
//! * [`Beneath`]: file operations relative to an open directory descriptor of the root, each
//!   path resolved by the kernel with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` (or, on
//!   kernels before 5.6, a component-by-component `O_NOFOLLOW` walk). A symlink swapped in
//!   between a check and a use cannot redirect a write: there is no separate check.
#![forbid(unsafe_code)]

mod beneath;
mod error;
mod lexical;

pub use beneath::{force_component_walk, Beneath, EntryKind, EntryMeta};
pub use error::PathError;
pub use lexical::{
    assert_within_root, is_within, normalize_lexically, relative_components, resolve,
    to_posix_relative,
};
