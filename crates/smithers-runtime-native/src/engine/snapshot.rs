//! `snapshot` and `restore` of a started sandbox: layer flips (see [`crate::layers`]).
//!
//! A flip holds every process of the sandbox still (the pause), moves the upper directory
//! away (into the store when it is frozen, among the leftovers when a restore drops it),
//! makes a new empty one at its path, and has the init's `--flip` helper swap the mounted
//! overlay for one over the new stack. The pause is the whole cost to the sandbox: a rename,
//! two directories, one short process and a remount. A process that holds a file or a working
//! directory in the workspace makes the kernel refuse the unmount: then everything is put back
//! as it was and the caller told to try between commands ([`RuntimeError::Busy`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use smithers_runtime::{RuntimeError, Snapshot};
use smithers_sandbox_init::plan::{flip_exit, FlipOverlay, FlipRequest, MountAttrs};

use crate::backend::Backend;
use crate::files::remove_tree;
use crate::init_command::InitCommand;
use crate::layers::{self, LayerRecord};
use crate::live::Live;
use crate::plan::{paths, HIDDEN_TOP_LEVEL};
use crate::runtime::NativeRuntime;

/// How long the helper may take (it mounts once or twice).
const FLIP_WAIT: Duration = Duration::from_secs(20);

/// What becomes of the upper directory in a flip.
enum Top {
    /// Frozen into the store as the new stack's top layer.
    Freeze,
    /// Dropped: the new stack is the one given.
    Drop(Vec<String>),
}

pub(crate) async fn snapshot(
    rt: &NativeRuntime,
    live: &Arc<Live>,
) -> Result<Snapshot, RuntimeError> {
    layers::check_flippable(&live.backend)?;
    rt.check_layer_flips().await?;
    let init = init_of(rt)?;
    let live = live.clone();
    detached(async move {
        // One flip at a time, and no request to the sandbox while one is made: from the look
        // at the record to the respawn (two at once would each build on the stack before both).
        let _gate = live.flip_gate.write().await;
        let record = LayerRecord::load(&live.backend)?;
        // Nothing written since the last flip: the stack as it is is the snapshot. Read while
        // the sandbox runs: a write that lands after this look is after the snapshot too.
        if layers::upper_is_empty(&live.backend.upper(), HIDDEN_TOP_LEVEL)? {
            return Ok(Snapshot {
                layers: record.stack,
                held_us: 0,
            });
        }
        let (layers, held) = paused_flip(init, &live, Top::Freeze).await?;
        Ok(Snapshot {
            layers,
            held_us: held.as_micros() as u64,
        })
    })
    .await
}

pub(crate) async fn restore(
    rt: &NativeRuntime,
    live: &Arc<Live>,
    snapshot: &Snapshot,
) -> Result<(), RuntimeError> {
    layers::check_flippable(&live.backend)?;
    rt.check_layer_flips().await?;
    let init = init_of(rt)?;
    let (live, target) = (live.clone(), snapshot.layers.clone());
    detached(async move {
        let _gate = live.flip_gate.write().await;
        let record = LayerRecord::load(&live.backend)?;
        // Only what this sandbox made or started from: never another session's layers.
        if let Some(id) = target.iter().find(|id| !record.refs.contains(id)) {
            return Err(RuntimeError::InvalidControl {
                control: "checkpoint",
                reason: format!("layer {id:?} is not one of this sandbox's checkpoints"),
            });
        }
        paused_flip(init, &live, Top::Drop(target))
            .await
            .map(|_| ())
    })
    .await
}

/// Runs a flip to its end on a task of its own: a caller that goes away (a dropped request)
/// must not leave the session handed over with no spawner, or the gate open mid-flip.
async fn detached<T: Send + 'static>(
    flip: impl std::future::Future<Output = Result<T, RuntimeError>> + Send + 'static,
) -> Result<T, RuntimeError> {
    tokio::spawn(flip)
        .await
        .map_err(|e| RuntimeError::spawn("flip the workspace's layers", e))?
}

/// The init to start the flip's helper with.
fn init_of(rt: &NativeRuntime) -> Result<InitCommand, RuntimeError> {
    rt.caps()
        .init
        .clone()
        .map_err(|reason| RuntimeError::Unavailable {
            runtime: "native",
            reason,
            fix: None,
        })
}

/// The flip (the caller holds the gate), between a handover and a respawn (see
/// `smithers_sandbox_init::session::spawner`): the spawner that serves the session holds
/// every process still and ends (refused, nothing changed, while a command runs); the
/// overlay is swapped; P1 starts a spawner confined over the new mount, which lets every
/// process go on. No request reaches the sandbox in between (the gate). Returns the new
/// stack and how long the processes were held (from the handover's request to the
/// respawn's answer: at most that).
async fn paused_flip(
    init: InitCommand,
    live: &Arc<Live>,
    top: Top,
) -> Result<(Vec<String>, Duration), RuntimeError> {
    use smithers_sandbox_init::plan::SessionRequest;
    let Some(ns_pid) = live.init_pid() else {
        return Err(RuntimeError::ControlUnsupported {
            runtime: "native",
            control: "checkpoint",
            reason: "the sandbox's init was forked by a zygote, whose pid is not ours to name"
                .into(),
        });
    };
    let backend = live.backend.clone();
    let prepared = crate::threads::blocking("prepare the layer flip", move || {
        prepare(&backend, &init, ns_pid, top)
    })
    .await??;
    let held = std::time::Instant::now();
    if let Err(e) = live
        .control("checkpoint", |id| SessionRequest::Handover { id })
        .await
    {
        let _ =
            crate::threads::blocking("call the layer flip off", move || prepared.call_off()).await;
        return Err(e);
    }
    let flipped =
        crate::threads::blocking("flip the workspace's layers", move || prepared.carry_out())
            .await
            .and_then(|r| r);
    // Over the new mount, or the old one when the flip did not happen.
    let respawned = live
        .control("respawn", |id| SessionRequest::Respawn { id })
        .await;
    let held = held.elapsed();
    let stack = flipped?;
    respawned.map(|()| (stack, held))
}

/// The names a flip moves things to, each made once.
struct Moves {
    /// Where the upper directory goes.
    top: PathBuf,
    /// Where the work directory goes (the old overlay's, unusable again).
    work: PathBuf,
    /// A work directory for the old overlay if it must be mounted again.
    put_back_work: PathBuf,
    /// The helper's mount point.
    scratch: PathBuf,
}

/// A flip made ready before the sandbox is held: names chosen, the new upper and work
/// directories made aside, the helper started and ready (its namespaces joined).
struct Prepared {
    backend: Backend,
    record: LayerRecord,
    stack: Vec<String>,
    top: Top,
    moves: Moves,
    /// The new upper and work directories, moved into place once the old ones are away.
    next: [PathBuf; 2],
    helper: Helper,
}

fn prepare(
    backend: &Backend,
    init: &InitCommand,
    ns_pid: i32,
    top: Top,
) -> Result<Prepared, RuntimeError> {
    let mut record = LayerRecord::load(backend)?;
    let old_paths = stack_paths(backend, &record.stack)?;
    let flips = layers::flips_dir(backend);
    std::fs::create_dir_all(&flips).map_err(|e| RuntimeError::io("create", &flips, e))?;
    let tag = layers::new_id();
    let (stack, moved_top) = match &top {
        Top::Freeze => {
            let id = layers::new_id();
            let frozen = layers::frozen_path(backend, &id)?;
            if let Some(store) = frozen.parent() {
                std::fs::create_dir_all(store).map_err(|e| RuntimeError::io("create", store, e))?;
            }
            let mut stack = vec![id];
            stack.extend(record.stack.iter().cloned());
            (stack, frozen)
        }
        Top::Drop(stack) => (stack.clone(), flips.join(format!("dropped-{tag}"))),
    };
    if stack.len() > layers::MAX_DEPTH {
        return Err(RuntimeError::InvalidControl {
            control: "checkpoint",
            reason: format!(
                "the workspace holds {} layers already, the most it may stack; restore an earlier checkpoint or end the session",
                stack.len() - 1
            ),
        });
    }
    let new_paths = match &top {
        // The new top is the upper directory, moved there at the flip.
        Top::Freeze => std::iter::once(moved_top.clone())
            .chain(old_paths.iter().cloned())
            .collect(),
        Top::Drop(_) => stack_paths(backend, &stack)?,
    };
    if let Top::Freeze = top {
        if record.refs.len() >= layers::MAX_KEPT {
            return Err(RuntimeError::InvalidControl {
                control: "checkpoint",
                reason: format!(
                    "the session keeps {} checkpointed layers, the most: end it, or start another from a checkpoint",
                    layers::MAX_KEPT
                ),
            });
        }
        // Named before it exists: a cleanup's collection never takes it.
        record.keep(&stack[0]);
        record.save(backend)?;
    }
    let moves = Moves {
        top: moved_top,
        work: flips.join(format!("work-{tag}")),
        put_back_work: flips.join(format!("putback-{tag}")),
        scratch: flips.join(format!("mnt-{tag}")),
    };
    let next = [
        flips.join(format!("next-upper-{tag}")),
        flips.join(format!("next-work-{tag}")),
    ];
    for dir in next.iter().chain([&moves.put_back_work, &moves.scratch]) {
        std::fs::create_dir(dir).map_err(|e| RuntimeError::io("create", dir, e))?;
    }
    let overlay = |layers: Vec<PathBuf>, upper: &Path, work: &Path| FlipOverlay {
        lower: backend.root_dir.clone(),
        layers,
        upper: upper.to_path_buf(),
        work: work.to_path_buf(),
        attrs: MountAttrs::RW,
        hide: HIDDEN_TOP_LEVEL.iter().map(|n| n.to_string()).collect(),
    };
    let request = FlipRequest {
        ns_pid,
        target: PathBuf::from(paths::WORKSPACE),
        mount: overlay(new_paths, &backend.upper(), &backend.work()),
        put_back: overlay(old_paths, &moves.top, &moves.put_back_work),
        scratch: moves.scratch.clone(),
    };
    let prepared = Prepared {
        backend: backend.clone(),
        record,
        stack,
        top,
        moves,
        next,
        helper: Helper::start(init, &request)?,
    };
    Ok(prepared)
}

impl Prepared {
    /// The flip, the sandbox held: the old directories away, the new in place, go.
    fn carry_out(mut self) -> Result<Vec<String>, RuntimeError> {
        let (upper, work) = (self.backend.upper(), self.backend.work());
        let moved = rename(&upper, &self.moves.top)
            .and_then(|()| rename(&work, &self.moves.work))
            .and_then(|()| rename(&self.next[0], &upper))
            .and_then(|()| rename(&self.next[1], &work));
        if let Err(e) = moved {
            // Back as they were (what moved), the helper told nothing.
            let _ = std::fs::rename(&self.moves.top, &upper);
            let _ = std::fs::rename(&self.moves.work, &work);
            self.call_off();
            return Err(e);
        }
        let (code, said) = self.helper.go()?;
        settle(
            &self.backend,
            std::mem::take(&mut self.record),
            std::mem::take(&mut self.stack),
            &self.top,
            &self.moves,
            code,
            said,
        )
    }

    /// Nothing is done: the helper ends, what was made for the flip goes.
    fn call_off(self) {
        self.helper.call_off();
        for dir in self
            .next
            .iter()
            .chain([&self.moves.put_back_work, &self.moves.scratch])
        {
            let _ = std::fs::remove_dir(dir);
        }
        if let Top::Freeze = self.top {
            let mut record = self.record;
            record.refs.retain(|id| Some(id) != self.stack.first());
            let _ = record.save(&self.backend);
        }
    }
}

/// After the helper: the record and the directories as its exit says they are.
fn settle(
    backend: &Backend,
    mut record: LayerRecord,
    stack: Vec<String>,
    top: &Top,
    moves: &Moves,
    code: Option<i32>,
    said: String,
) -> Result<Vec<String>, RuntimeError> {
    let (upper, work) = (backend.upper(), backend.work());
    let _ = std::fs::remove_dir(&moves.scratch);
    let unknown = |record, stack, said| {
        let why = format!("the flip's helper did not finish ({said})");
        kept_for_review(backend, record, stack, why)
    };
    let Some(code) = code else {
        return unknown(record, stack, said);
    };
    match code {
        flip_exit::DONE => {
            record.stack = stack.clone();
            record.save(backend)?;
            let _ = std::fs::remove_dir(&moves.put_back_work);
            let leftovers = [moves.work.clone(), moves.top.clone()];
            let dropped = matches!(top, Top::Drop(_));
            // Off the pause's path: a dropped upper directory can be large.
            std::thread::spawn(move || {
                let _ = remove_tree(&leftovers[0]);
                if dropped {
                    let _ = remove_tree(&leftovers[1]);
                }
            });
            Ok(stack)
        }
        // The old top is kept in the stack so that nothing written is lost to the review.
        flip_exit::LOST => kept_for_review(
            backend,
            record,
            stack,
            format!("the sandbox has no workspace any more: {said}"),
        ),
        _ => {
            // Nothing changed for the sandbox (busy or failed early), or the old overlay is
            // back over the moved upper directory: its names go back either way. The new
            // upper directory was never mounted, so it is empty; if it is not, nobody knows
            // what happened, and nothing is undone.
            if std::fs::remove_dir(&upper).is_err() {
                return unknown(record, stack, said);
            }
            rename(&moves.top, &upper)?;
            if code != flip_exit::PUT_BACK {
                let _ = std::fs::remove_dir(&work);
                rename(&moves.work, &work)?;
                let _ = std::fs::remove_dir(&moves.put_back_work);
            }
            if let Top::Freeze = top {
                record
                    .refs
                    .retain(|id| stack.first().is_none_or(|top| top != id));
                record.save(backend)?;
            }
            Err(match code {
                flip_exit::BUSY => RuntimeError::Busy {
                    verb: "checkpoint",
                    reason: "a process of the sandbox has a file or its working directory in the workspace; try between commands".into(),
                },
                _ => RuntimeError::Spawn {
                    operation: "flip the workspace's layers".into(),
                    reason: said,
                },
            })
        }
    }
}

/// A flip that went wrong past the point of undoing (the workspace lost, or the helper ended
/// without saying how far it got): nothing is removed or moved back, and the record names the
/// new stack, so that whichever overlay is mounted, what was written is in a layer collect
/// reads. The session should end.
fn kept_for_review(
    backend: &Backend,
    mut record: LayerRecord,
    stack: Vec<String>,
    why: String,
) -> Result<Vec<String>, RuntimeError> {
    record.stack = stack;
    record.save(backend)?;
    Err(RuntimeError::Spawn {
        operation: "flip the workspace's layers".into(),
        reason: format!("{why}; stop the session, whose change is kept for review"),
    })
}

fn stack_paths(backend: &Backend, ids: &[String]) -> Result<Vec<PathBuf>, RuntimeError> {
    ids.iter()
        .map(|id| layers::existing_frozen(backend, id))
        .collect()
}

fn rename(from: &Path, to: &Path) -> Result<(), RuntimeError> {
    std::fs::rename(from, to).map_err(|e| RuntimeError::io("move", from, e))
}

/// The init's `--flip` helper, started and ready (see `smithers_sandbox_init::flip`).
struct Helper {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
}

impl Helper {
    fn start(init: &InitCommand, request: &FlipRequest) -> Result<Helper, RuntimeError> {
        let spawn_err = |e: std::io::Error| RuntimeError::spawn("start the layer flip", e);
        let mut child = std::process::Command::new(&init.program)
            .args(&init.args)
            .arg("--flip")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_err)?;
        let mut stdin = child.stdin.take();
        let mut line = serde_json::to_vec(request).unwrap_or_default();
        line.push(b'\n');
        let sent = stdin.as_mut().map(|s| s.write_all(&line));
        let mut helper = Helper { child, stdin };
        if let Some(Err(e)) = sent {
            helper.call_off();
            return Err(spawn_err(e));
        }
        // `ready`, or the helper's end (its stderr says why).
        let mut ready = [0u8; 6];
        let said_ready = helper.child.stdout.as_mut().map(|out| {
            use std::io::Read;
            out.read_exact(&mut ready)
        });
        if !matches!(said_ready, Some(Ok(()))) || &ready != b"ready\n" {
            let (_, said) = helper.finish()?;
            return Err(RuntimeError::Spawn {
                operation: "prepare the layer flip".into(),
                reason: said,
            });
        }
        Ok(helper)
    }

    /// Go: the flip is made; its exit code (`None`: killed, or past its time) and what it
    /// said.
    fn go(mut self) -> Result<(Option<i32>, String), RuntimeError> {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"g");
        }
        self.finish()
    }

    /// The helper ends without doing anything.
    fn call_off(mut self) {
        self.stdin.take();
        let _ = self.finish();
    }

    fn finish(&mut self) -> Result<(Option<i32>, String), RuntimeError> {
        self.stdin.take();
        let spawn_err = |e: std::io::Error| RuntimeError::spawn("flip the workspace's layers", e);
        let deadline = std::time::Instant::now() + FLIP_WAIT;
        let status = loop {
            match self.child.try_wait().map_err(spawn_err)? {
                Some(status) => break Some(status),
                None if std::time::Instant::now() > deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
                None => std::thread::sleep(Duration::from_micros(100)),
            }
        };
        let mut said = String::new();
        if let Some(stderr) = self.child.stderr.take() {
            use std::io::Read;
            let _ = stderr.take(16 * 1024).read_to_string(&mut said);
        }
        let said = match status {
            None => format!("it did not end within {FLIP_WAIT:?}"),
            Some(_) => said.trim().to_string(),
        };
        Ok((status.and_then(|s| s.code()), said))
    }
}
