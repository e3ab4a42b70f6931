//! Rendering results and errors, shared by every command group.
//!
//! Commands return `anyhow::Result`; a failure that has a stable code travels as an
//! [`ErrorReport`] inside the `anyhow::Error` (see [`Coded::coded`]), anything else is reported
//! as `INTERNAL` with its cause chain as the message.
//!
//! Everything a command prints for a person goes through `smithers_terminal` ([`inert`],
//! [`name`]): ids, paths, reasons, messages and outputs may come from a step, a bundle or a
//! database under the project, and reach the terminal with every control character shown
//! escaped. JSON output is printed as serde_json writes it (JSON escapes control characters
//! itself) and is never escaped twice.

use std::process::ExitCode;

use serde_json::Value;
use smithers_errors::{CodedError, ErrorCode, ErrorReport};

/// `eprintln!` that never panics: once stderr's reader is gone (`run ... 2>&1 | head`) a
/// write fails, and is dropped, where `eprintln!` would panic and take a step still running
/// with it. What a step printed is in its bundle's log anyway.
///
/// The line is formatted first and written whole: stderr is unbuffered, and `writeln!` on it
/// makes a write for each piece of the format (`run -- true`'s report was 88 writes for its
/// 11 lines), which a terminal pays for each, and between which another thread's line (the
/// step's relayed stderr) could land mid-line.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut line = format!($($arg)*);
        line.push('\n');
        let _ = std::io::stderr().write_all(line.as_bytes());
    }};
}
pub(crate) use say;

/// [`say!`] without the newline (`eprint!`), written whole as well.
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = std::io::stderr().write_all(format!($($arg)*).as_bytes());
    }};
}
pub(crate) use say_raw;

/// Exit status for rejected input or a failed operation (usage errors exit 2, from clap).
pub const EXIT_REJECTED: u8 = 1;

/// Converts a library error into an `anyhow::Error` that keeps its code and details.
pub trait Coded<T> {
    /// `result.coded()?` in a command.
    fn coded(self) -> anyhow::Result<T>;
}

impl<T, E: CodedError> Coded<T> for Result<T, E> {
    fn coded(self) -> anyhow::Result<T> {
        self.map_err(|e| anyhow::Error::new(e.report()))
    }
}

/// A coded error made on the spot (a CLI-level rule, such as an unreadable spec file).
pub fn coded_error(code: ErrorCode, message: impl Into<String>, details: Value) -> anyhow::Error {
    anyhow::Error::new(ErrorReport::new(code, message).with_details(details))
}

/// The report for any error: its own when it carries one, else `INTERNAL` with the chain.
pub fn to_report(err: &anyhow::Error) -> ErrorReport {
    if let Some(report) = err.downcast_ref::<ErrorReport>() {
        return report.clone();
    }
    ErrorReport::new(ErrorCode::Internal, format!("{err:#}"))
}

/// One line of untrusted text made inert for a terminal (`smithers_terminal::line`).
pub fn inert(s: &str) -> String {
    smithers_terminal::line(s)
}

/// A file name as git shows it (`smithers_patch::shown_path`: quoted from its bytes, a
/// non-UTF-8 name's quoted path string not quoted twice).
pub fn name(path: &str) -> String {
    smithers_patch::shown_path(path)
}

/// Whether colour and reverse-video marks may be used on a terminal (NO_COLOR unset or empty).
pub fn color_allowed() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Prints `err` (JSON on stdout with `json`, text on stderr otherwise) and returns exit 1.
pub fn report_error(err: &anyhow::Error, json: bool) -> ExitCode {
    ExitCode::from(report_error_code(err, json))
}

/// [`report_error`], the exit status as a number (the resident service sends it).
pub fn report_error_code(err: &anyhow::Error, json: bool) -> u8 {
    use std::io::Write as _;
    let report = to_report(err);
    if json {
        let _ = writeln!(std::io::stdout(), "{}", report.to_json());
    } else {
        say!("{}", render_text(&report));
    }
    EXIT_REJECTED
}

/// `error [CODE]: message`, then one indented `key: value` line per detail; the message and
/// every detail inert (they may quote a step's data), one line each.
pub fn render_text(report: &ErrorReport) -> String {
    let mut s = format!("error [{}]: {}", report.code, inert(&report.message));
    if let Value::Object(details) = &report.details {
        for (k, v) in details {
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            s.push_str(&format!("\n  {}: {}", inert(k), inert(&v)));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coded_errors_keep_code_and_details() {
        let err = coded_error(
            ErrorCode::ToolPathEscape,
            "Path escapes sandbox root",
            serde_json::json!({"path": "../x"}),
        );
        let r = to_report(&err);
        assert_eq!(r.code, ErrorCode::ToolPathEscape);
        assert_eq!(
            render_text(&r),
            "error [TOOL_PATH_ESCAPE]: Path escapes sandbox root\n  path: ../x"
        );
        let hostile = ErrorReport::new(ErrorCode::InvalidInput, "bad \x1b]52;c;eA==\x07 name")
            .with_details(serde_json::json!({"path": "a\nerror [FAKE]: b\u{202e}"}));
        assert_eq!(
            render_text(&hostile),
            "error [INVALID_INPUT]: bad ^[]52;c;eA==^G name\n  path: a^Jerror [FAKE]: b\\u{202e}"
        );
        let other = anyhow::anyhow!("boom").context("while testing");
        assert_eq!(to_report(&other).code, ErrorCode::Internal);
        assert_eq!(to_report(&other).message, "while testing: boom");
    }
}
