//! A session's checkpoints, held by its holder: `session checkpoint` freezes the workspace
//! as it is (the engine's snapshot: a layer flip, no copy), `session restore` puts it back to
//! one, and `session fork` starts another session from one (made now when none is named).
//! Checkpoints are named `cp-1`, `cp-2`, … in the order made; the snapshot behind a name
//! never leaves this process but as the fork's layer ids, which the new session's engine
//! checks again. Each is recorded as an event of the session (`SessionCheckpoint`,
//! `SessionRestore`, `SessionFork`).

use serde_json::{json, Value};
use smithers_errors::CodedError;
use smithers_runtime::{Checkpoints, RuntimeError, Snapshot};

use super::runtime::Started;
use super::wire::error_json;

/// Records an event of the session (its type, its payload).
pub(super) type Record<'a> = Box<dyn Fn(&str, Value) + 'a>;

/// What a checkpoint, restore or fork needs of the holder.
pub(super) struct Ctx<'a> {
    pub started: &'a Started,
    pub rt: &'a tokio::runtime::Handle,
    pub checkpoints: &'a Checkpoints,
    pub record: Record<'a>,
}

fn engine_error(e: &RuntimeError) -> Value {
    let report = e.report();
    error_json(report.code.as_str(), &report.message, report.details)
}

fn unknown(name: &str) -> Value {
    error_json(
        "NOT_FOUND",
        &format!(
            "the session has no checkpoint {}",
            crate::output::inert(name)
        ),
        json!({ "checkpoint": name }),
    )
}

/// A snapshot of the workspace now, named.
fn make(ctx: &Ctx<'_>) -> Result<(String, Snapshot), Value> {
    // Said before the flip: a refused name must not leave a layer behind.
    ctx.checkpoints.room().map_err(|e| engine_error(&e))?;
    let snapshot = ctx
        .rt
        .block_on(ctx.started.engine.snapshot(&ctx.started.handle))
        .map_err(|e| engine_error(&e))?;
    let name = ctx
        .checkpoints
        .add(snapshot.clone())
        .map_err(|e| engine_error(&e))?;
    (ctx.record)(
        "SessionCheckpoint",
        json!({ "checkpoint": name, "layers": snapshot.layers.len(), "heldUs": snapshot.held_us }),
    );
    Ok((name, snapshot))
}

pub(super) fn checkpoint(ctx: &Ctx<'_>) -> Value {
    match make(ctx) {
        Ok((name, snapshot)) => json!({
            "ok": true,
            "checkpoint": name,
            "layers": snapshot.layers.len(),
            "heldUs": snapshot.held_us,
        }),
        Err(error) => error,
    }
}

pub(super) fn restore(ctx: &Ctx<'_>, name: &str) -> Value {
    let Some(snapshot) = ctx.checkpoints.named(name) else {
        return unknown(name);
    };
    match ctx
        .rt
        .block_on(ctx.started.engine.restore(&ctx.started.handle, &snapshot))
    {
        Ok(()) => {
            (ctx.record)("SessionRestore", json!({ "checkpoint": name }));
            json!({ "ok": true, "checkpoint": name })
        }
        Err(e) => engine_error(&e),
    }
}

/// The layers a fork starts from, and this session's start options for it.
pub(super) fn fork(ctx: &Ctx<'_>, name: Option<&str>) -> Value {
    let options = match start_options() {
        Ok(options) => options,
        Err(message) => return error_json("INVALID_INPUT", &message, json!({})),
    };
    let Ok(cwd) = std::env::current_dir() else {
        return error_json(
            "INTERNAL",
            "the session's working directory is gone",
            json!({}),
        );
    };
    let (name, snapshot) = match name {
        Some(name) => match ctx.checkpoints.named(name) {
            Some(snapshot) => (name.to_string(), snapshot),
            None => return unknown(name),
        },
        None => match make(ctx) {
            Ok(made) => made,
            Err(error) => return error,
        },
    };
    json!({
        "ok": true,
        "checkpoint": name,
        "layers": snapshot.layers,
        "startOptions": options,
        "cwd": cwd,
    })
}

/// This holder's own options (`session __hold …`), without the ids and layers that were this
/// session's own: what a fork of it is started with.
fn start_options() -> Result<Vec<String>, String> {
    let all: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Everything after `__hold` (the holder is `smithers-sandbox [--json] session __hold …`).
    let at = all
        .iter()
        .position(|a| a == "__hold")
        .map_or(all.len(), |i| i + 1);
    let argv: Vec<String> = all[at..]
        .iter()
        .cloned()
        .map(|a| {
            a.into_string()
                .map_err(|_| "the session was started with an option that is not UTF-8".to_string())
        })
        .collect::<Result<_, _>>()?;
    Ok(without_own(&argv))
}

/// `argv` without `--run-id`, `--sandbox-id` and `--from-layers` (with their values, as one
/// word or two): a fork has its own ids and layers. (It is started in this holder's working
/// directory, so a relative `--root` or `--db` names what it names here.)
fn without_own(argv: &[String]) -> Vec<String> {
    const OWN: [&str; 3] = ["--run-id", "--sandbox-id", "--from-layers"];
    let mut kept = Vec::new();
    let mut words = argv.iter();
    while let Some(word) = words.next() {
        if word == "--" {
            kept.push(word.clone());
            kept.extend(words.by_ref().cloned());
            break;
        }
        if OWN.contains(&word.as_str()) {
            words.next();
            continue;
        }
        if OWN.iter().any(|o| word.starts_with(&format!("{o}="))) {
            continue;
        }
        kept.push(word.clone());
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_drops_the_sessions_own_ids_and_layers_only() {
        let argv: Vec<String> = [
            "--run-id",
            "r1",
            "--network",
            "--sandbox-id=s1",
            "--from-layers",
            "a,b",
            "--env",
            "K=--run-id",
            "--root",
            "p",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            without_own(&argv),
            ["--network", "--env", "K=--run-id", "--root", "p"]
        );
    }
}
