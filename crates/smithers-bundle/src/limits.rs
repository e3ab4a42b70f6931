//! The bundle limits. Names and values are part of the contract (spec §2) and equal the
//! exports of `@smithers-orchestrator/sandbox/src/bundle.js`.

/// Largest total size of a bundle's regular files (and of the estimate at write time): 100 MiB.
pub const SANDBOX_MAX_BUNDLE_BYTES: u64 = 100 * 1024 * 1024;
/// Largest README.md (the JSON manifest): 5 MiB.
pub const SANDBOX_MAX_README_BYTES: u64 = 5 * 1024 * 1024;
/// Most patch files in a bundle; also the cap on patches and on artifacts at write time.
pub const SANDBOX_MAX_PATCH_FILES: usize = 1000;
/// Longest run id, in UTF-16 code units (JavaScript `string.length`).
pub const SANDBOX_BUNDLE_RUN_ID_MAX_LENGTH: usize = 256;
/// Longest bundle, patch or artifact path, in UTF-16 code units.
pub const SANDBOX_BUNDLE_PATH_MAX_LENGTH: usize = 1024;
/// Deepest nesting of the outputs JSON; the root value is at depth 1.
pub const SANDBOX_BUNDLE_OUTPUT_MAX_DEPTH: usize = 16;
/// Longest array anywhere in the outputs JSON.
pub const SANDBOX_BUNDLE_OUTPUT_MAX_ARRAY_LENGTH: usize = 512;
/// Longest string value in the outputs JSON, in UTF-16 code units. Object keys are not
/// measured, exactly as in the JavaScript package.
pub const SANDBOX_BUNDLE_OUTPUT_MAX_STRING_LENGTH: usize = 64 * 1024;

/// A limit by name, for error details (`{"limit": "SANDBOX_MAX_PATCH_FILES", ...}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// [`SANDBOX_MAX_BUNDLE_BYTES`]
    MaxBundleBytes,
    /// [`SANDBOX_MAX_README_BYTES`]
    MaxReadmeBytes,
    /// [`SANDBOX_MAX_PATCH_FILES`]
    MaxPatchFiles,
    /// [`SANDBOX_BUNDLE_RUN_ID_MAX_LENGTH`]
    RunIdMaxLength,
    /// [`SANDBOX_BUNDLE_PATH_MAX_LENGTH`]
    PathMaxLength,
    /// [`SANDBOX_BUNDLE_OUTPUT_MAX_DEPTH`]
    OutputMaxDepth,
    /// [`SANDBOX_BUNDLE_OUTPUT_MAX_ARRAY_LENGTH`]
    OutputMaxArrayLength,
    /// [`SANDBOX_BUNDLE_OUTPUT_MAX_STRING_LENGTH`]
    OutputMaxStringLength,
}

impl Limit {
    /// The constant's name, e.g. `"SANDBOX_MAX_PATCH_FILES"`.
    pub const fn name(self) -> &'static str {
        match self {
            Limit::MaxBundleBytes => "SANDBOX_MAX_BUNDLE_BYTES",
            Limit::MaxReadmeBytes => "SANDBOX_MAX_README_BYTES",
            Limit::MaxPatchFiles => "SANDBOX_MAX_PATCH_FILES",
            Limit::RunIdMaxLength => "SANDBOX_BUNDLE_RUN_ID_MAX_LENGTH",
            Limit::PathMaxLength => "SANDBOX_BUNDLE_PATH_MAX_LENGTH",
            Limit::OutputMaxDepth => "SANDBOX_BUNDLE_OUTPUT_MAX_DEPTH",
            Limit::OutputMaxArrayLength => "SANDBOX_BUNDLE_OUTPUT_MAX_ARRAY_LENGTH",
            Limit::OutputMaxStringLength => "SANDBOX_BUNDLE_OUTPUT_MAX_STRING_LENGTH",
        }
    }

    /// The constant's value.
    pub const fn value(self) -> u64 {
        match self {
            Limit::MaxBundleBytes => SANDBOX_MAX_BUNDLE_BYTES,
            Limit::MaxReadmeBytes => SANDBOX_MAX_README_BYTES,
            Limit::MaxPatchFiles => SANDBOX_MAX_PATCH_FILES as u64,
            Limit::RunIdMaxLength => SANDBOX_BUNDLE_RUN_ID_MAX_LENGTH as u64,
            Limit::PathMaxLength => SANDBOX_BUNDLE_PATH_MAX_LENGTH as u64,
            Limit::OutputMaxDepth => SANDBOX_BUNDLE_OUTPUT_MAX_DEPTH as u64,
            Limit::OutputMaxArrayLength => SANDBOX_BUNDLE_OUTPUT_MAX_ARRAY_LENGTH as u64,
            Limit::OutputMaxStringLength => SANDBOX_BUNDLE_OUTPUT_MAX_STRING_LENGTH as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_the_contract() {
        assert_eq!(SANDBOX_MAX_BUNDLE_BYTES, 104_857_600);
        assert_eq!(SANDBOX_MAX_README_BYTES, 5_242_880);
        assert_eq!(SANDBOX_MAX_PATCH_FILES, 1000);
        assert_eq!(SANDBOX_BUNDLE_RUN_ID_MAX_LENGTH, 256);
        assert_eq!(SANDBOX_BUNDLE_PATH_MAX_LENGTH, 1024);
        assert_eq!(SANDBOX_BUNDLE_OUTPUT_MAX_DEPTH, 16);
        assert_eq!(SANDBOX_BUNDLE_OUTPUT_MAX_ARRAY_LENGTH, 512);
        assert_eq!(SANDBOX_BUNDLE_OUTPUT_MAX_STRING_LENGTH, 65_536);
        assert_eq!(Limit::MaxPatchFiles.name(), "SANDBOX_MAX_PATCH_FILES");
        assert_eq!(Limit::MaxReadmeBytes.value(), 5_242_880);
    }
}
