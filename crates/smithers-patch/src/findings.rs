//! What a reviewer must be told before reading the diff ([`ReviewFindings`]), and the flagged
//! paths it lists ([`RiskyPath`]): plain data, below both the review's rendering (which fills
//! and renders it) and the decoding of binary-carried text (which names the files it could
//! not show as text), so that neither of those modules uses the other back.

use serde::{Deserialize, Serialize};

/// A changed file the host will run later without anyone asking, and why it is flagged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RiskyPath {
    pub path: String,
    pub reason: String,
}

/// What a reviewer must be told before reading the diff.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewFindings {
    /// Paths whose name or changed content holds control characters, escape sequences, bidi
    /// controls (shown escaped; see `smithers_terminal`). A CR that ends a line (CRLF line
    /// endings) is shown but not counted: nothing follows it on the line to hide.
    pub control_characters: Vec<String>,
    /// Changed files the host runs by itself later (hooks, editor tasks, CI, `.envrc`).
    pub runs_on_host: Vec<RiskyPath>,
    /// Paths the host changed while the step ran, which the step changed too (the bundle's
    /// `changeNotes.hostChanged`): their diff is against the host's newer version, and accept
    /// refuses them as conflicts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_changed: Vec<String>,
    /// Changes of the step that no patch carries, with why (`changeNotes.leftOut`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<RiskyPath>,
    /// Left-out entries beyond those listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_out_unlisted: u64,
    /// Files carried as git binary patches that git may call text but the review could not
    /// read as text, with why: shown by size only (see [`PatchReview`](crate::PatchReview)).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_shown_as_text: Vec<RiskyPath>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ReviewFindings {
    /// Nothing to warn about.
    pub fn is_empty(&self) -> bool {
        self.control_characters.is_empty()
            && self.runs_on_host.is_empty()
            && self.host_changed.is_empty()
            && self.left_out.is_empty()
            && self.left_out_unlisted == 0
            && self.not_shown_as_text.is_empty()
    }
}
