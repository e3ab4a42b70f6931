//! The Smithers sandbox result bundle (spec §2), compatible with the JavaScript package
//! `@smithers-orchestrator/sandbox` (0.32): a bundle it writes validates here with the same
//! result, a bundle written here validates there, and every rejection has the same code and,
//! where JS has one, the same message.
//!
//! ```text
//! <bundle>/README.md            JSON manifest (2-space pretty JSON, JSON.stringify's bytes)
//! <bundle>/patches/**.patch     patch files
//! <bundle>/artifacts/...        free-form files
//! <bundle>/logs/stream.ndjson   NDJSON log
//! ```
//!
//! - [`write_bundle`] / [`WriteParams`]: validate everything, then write; README.md last.
//! - [`validate_bundle`] → [`ValidatedBundle`]: the spec's checks in the spec's order.
//! - [`check_output_bounds`]: the outputs' JSON bounds with JavaScript semantics.
//! - [`js_json`]: `JSON.stringify` byte for byte, JS `trim`, UTF-16 lengths.
//!
//! # Deliberate differences from the JavaScript package
//!
//! - Patch paths are confined by path components, not string prefixes: `patches/..x.patch`
//!   is a legal patch file (JS rejects it), and a bundle at `/` works.
//! - `patchFiles` is sorted (byte order); JS returns directory-walk order.
//! - Writing checks more, before writing anything: `status` must be one of the three (JS
//!   writes any status, which its validator then rejects); README.md must fit 5 MiB (JS writes
//!   it and its validator rejects it); a `diffBundle` that would push README.md past 5 MiB is
//!   dropped; patch paths must lie strictly inside `patches/` and every path inside the bundle
//!   (JS finds out midway, leaving a half-written directory); colliding targets are refused;
//!   `runId: null` in a JSON spec is treated as absent (JS writes `"runId": null`).
//! - The stream log is copied byte for byte (JS re-encodes it as UTF-8, replacing invalid
//!   bytes with U+FFFD).
//! - A README.md that JavaScript can parse but `serde_json` cannot hold is rejected as
//!   invalid JSON: numbers beyond the f64 range (`1e400`, which JS turns into `Infinity`),
//!   lone UTF-16 surrogate escapes (`"\ud800"`), and nesting deeper than 128 levels. The
//!   JavaScript writer cannot produce the first, and the last only in a `diffBundle`.
//! - Numbers follow JavaScript semantics (f64) on output; see [`js_json`].
#![forbid(unsafe_code)]

mod bounds;
mod error;
pub mod js_json;
mod limits;
mod manifest;
mod validate;
mod write;

pub use bounds::check_output_bounds;
pub use error::BundleError;
pub use limits::*;
pub use manifest::{
    BundleStatus, ChangeNotes, CommitFile, CommitInfo, CommitSeries, DiffBundle, DiffOperation,
    DiffPatch, LeftOut, Manifest, ValidatedBundle, COMMITS_BUNDLE_FILE, MAX_SERIES_PATCH_BYTES,
    SERIES_PATCH_FILE,
};
pub use smithers_paths::PathError;
pub use validate::{assert_patch_path_safe, parse_change_notes, parse_manifest, validate_bundle};
pub use write::{
    holds_only_prepared_dirs, prepare_bundle_dirs, start_sync_threads, write_bundle,
    write_bundle_with, BundleFile, WriteOptions, WriteParams, WrittenBundle,
};
