//! The init's sandbox mode, as executed or forked (by the zygote, or in-process): read the
//! prelude, enter the namespaces, read the plan, start P1 and supervise it.

use crate::control::{report_error, report_plan_error, ControlReader};
use crate::namespaces::enter_namespaces;
use crate::p0::{await_step_taken, start, supervise};
use crate::sys;

pub(crate) fn run_sandbox() -> i32 {
    // The sandbox, not the host's own processes, is what the OOM killer should take first
    // when memory runs out (with or without a memory limit): every sandbox process inherits
    // this. Raising one's own score needs no privilege; if /proc is not there it stays as is.
    let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
    let mut control = ControlReader::default();
    let prelude = match control.prelude() {
        Ok(p) => p,
        Err(message) => return report_plan_error(message),
    };
    let cgroups = match enter_namespaces(&prelude) {
        Ok(c) => c,
        Err((stage, err)) => {
            report_error(stage, &err);
            return 1;
        }
    };
    let plan = match control.plan() {
        Ok(p) => p,
        Err(message) => return report_plan_error(message),
    };
    match start(&prelude, cgroups, &plan) {
        Ok(started) => {
            if let Some(taken) = started.step_taken {
                // Nothing may follow the warm plan before P1 has read its step: the runtime
                // sends the step only after P1's `warm` report.
                if !control.buf.is_empty() {
                    let _ = sys::kill(started.pid, libc::SIGKILL);
                    report_plan_error(
                        "the runtime sent more than the warm plan before the sandbox was warm"
                            .to_string(),
                    );
                }
                await_step_taken(started.pid, taken);
            }
            supervise(started.pid, &control.buf)
        }
        Err((stage, err)) => {
            report_error(stage, &err);
            1
        }
    }
}
