//! `home ls` and `home rm NAME`: the persistent homes `--home NAME` gives a step's `$HOME`
//! (kept by the native runtime: `smithers_runtime_native::home`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::json;
use smithers_errors::ErrorCode;

use crate::output::{coded_error, inert, say};

#[derive(Debug, Args)]
pub struct HomeArgs {
    #[command(subcommand)]
    pub command: HomeCommand,
}

#[derive(Debug, Subcommand)]
pub enum HomeCommand {
    /// The homes kept for you, with their size and when they last changed.
    Ls,
    /// Remove a home (what a step kept there goes with it).
    Rm(RmArgs),
}

#[derive(Debug, Args)]
pub struct RmArgs {
    /// The home's name (as given to --home).
    pub name: String,
}

fn root() -> anyhow::Result<PathBuf> {
    let env = std::env::vars().collect();
    smithers_runtime_native::home::homes_root(&env).ok_or_else(|| {
        coded_error(
            ErrorCode::TaskRuntimeUnavailable,
            "no place for homes: set $SMITHERS_HOMES_DIR, $XDG_DATA_HOME or $HOME".to_string(),
            serde_json::Value::Null,
        )
    })
}

pub fn run(args: &HomeArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    match &args.command {
        HomeCommand::Ls => ls(json_out),
        HomeCommand::Rm(a) => rm(&a.name, json_out),
    }
}

fn ls(json_out: bool) -> anyhow::Result<ExitCode> {
    let root = root()?;
    let mut homes = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&root) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(md) = std::fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if !md.is_dir() {
                continue;
            }
            let modified_ms = md
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64);
            homes.push(json!({
                "name": name,
                "path": entry.path(),
                "bytes": size_of(&entry.path()),
                "modifiedMs": modified_ms,
            }));
        }
    }
    homes.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    if json_out {
        println!("{}", serde_json::Value::Array(homes));
        return Ok(ExitCode::SUCCESS);
    }
    if homes.is_empty() {
        say!("no homes kept (in {})", inert(&root.display().to_string()));
    }
    for h in &homes {
        say!(
            "{}  {} bytes  {}",
            inert(h["name"].as_str().unwrap_or("")),
            h["bytes"],
            inert(h["path"].as_str().unwrap_or(""))
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The bytes of the files under `dir` (links not followed; bounded to a million entries).
fn size_of(dir: &Path) -> u64 {
    let mut total = 0;
    let mut seen = 0u32;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > 1_000_000 {
                return total;
            }
            match std::fs::symlink_metadata(entry.path()) {
                Ok(md) if md.is_dir() => stack.push(entry.path()),
                Ok(md) => total += md.len(),
                Err(_) => {}
            }
        }
    }
    total
}

fn rm(name: &str, json_out: bool) -> anyhow::Result<ExitCode> {
    smithers_runtime::config::validate_id("home", name).map_err(|e| {
        coded_error(
            ErrorCode::InvalidInput,
            e.to_string(),
            serde_json::Value::Null,
        )
    })?;
    let path = root()?.join(name);
    match std::fs::symlink_metadata(&path) {
        Ok(md) if md.is_dir() => std::fs::remove_dir_all(&path)?,
        // A link where a home would be is removed, never followed.
        Ok(_) => std::fs::remove_file(&path)?,
        Err(_) => {
            return Err(coded_error(
                ErrorCode::NotFound,
                format!("no home {}", inert(name)),
                json!({ "home": name }),
            ))
        }
    }
    if json_out {
        println!("{}", json!({ "removed": name }));
    } else {
        say!("home {} removed", inert(name));
    }
    Ok(ExitCode::SUCCESS)
}
