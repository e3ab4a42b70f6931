//! `session checkpoint`, `session restore` and `session fork`: clients of the holder's
//! checkpoints (see `checkpoints`). A fork is a new session, started as `session start`
//! starts one, with the parent's options, in the parent's working directory, from the layers
//! the parent's holder gave.

use std::process::ExitCode;

use serde_json::{json, Value};

use super::client::{ask_with, invalid, launch};
use super::holder::socket_of;
use super::wire::Request;
use super::{ForkArgs, IdArgs, RestoreArgs};
use crate::output::{inert, say};

pub fn checkpoint(args: &IdArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let answer = ask_with(&args.id, &socket_of(&args.id)?, &Request::Checkpoint, &[])?;
    let name = answer["checkpoint"].as_str().unwrap_or_default();
    if json_out {
        println!(
            "{}",
            json!({ "sessionId": args.id, "checkpoint": name, "layers": answer["layers"], "heldUs": answer["heldUs"] })
        );
    } else {
        println!("{}", inert(name));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn restore(args: &RestoreArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let request = Request::Restore {
        checkpoint: args.checkpoint.clone(),
    };
    ask_with(&args.id, &socket_of(&args.id)?, &request, &[])?;
    if json_out {
        println!(
            "{}",
            json!({ "sessionId": args.id, "checkpoint": args.checkpoint })
        );
    } else {
        say!(
            "session {} is back at {}",
            inert(&args.id),
            inert(&args.checkpoint)
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn fork(args: &ForkArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let request = Request::Fork {
        checkpoint: args.checkpoint.clone(),
    };
    let answer = ask_with(&args.id, &socket_of(&args.id)?, &request, &[])?;
    let layers = strings(&answer["layers"])?;
    if layers.iter().any(|id| id.contains(',')) {
        return Err(invalid(
            "the session answered a layer id with a comma".into(),
        ));
    }
    let cwd = answer["cwd"]
        .as_str()
        .map(std::path::PathBuf::from)
        .ok_or_else(|| invalid("the session did not say where it runs".into()))?;
    let run_id = crate::commands::run::new_id("run");
    let sandbox_id = crate::commands::run::new_id("ses");
    let mut options: Vec<std::ffi::OsString> = vec![
        "--run-id".into(),
        run_id.clone().into(),
        "--sandbox-id".into(),
        sandbox_id.clone().into(),
    ];
    if !layers.is_empty() {
        options.extend(["--from-layers".into(), layers.join(",").into()]);
    }
    // The parent's options (those after `--`, which a session has none of, stay last).
    let parent = strings(&answer["startOptions"])?;
    let (before, after): (Vec<_>, Vec<_>) = match parent.iter().position(|w| w == "--") {
        Some(at) => (parent[..at].to_vec(), parent[at..].to_vec()),
        None => (parent, Vec::new()),
    };
    options.extend(before.into_iter().chain(after).map(Into::into));
    launch(&options, &run_id, &sandbox_id, Some(&cwd), json_out)
}

fn strings(value: &Value) -> anyhow::Result<Vec<String>> {
    serde_json::from_value(value.clone())
        .map_err(|_| invalid("the session's answer is not what a fork needs".into()))
}
