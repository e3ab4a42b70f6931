//! The warm pool: sandboxes prepared before any step asks for one, so that a step's sandbox
//! costs only what depends on the step (`NativeOptions::warm`).
//!
//! A warm sandbox is a whole init as `execute` would start it, stopped halfway: forked from
//! the zygote, its user, mount, pid, IPC, UTS and network namespaces made, P1 born into the
//! sandbox's cgroups, the prepared root bound and every mount that depends on no step made
//! (system directories, `/etc`, `/proc`, `/dev`, `/tmp`, `$HOME`: the prefix
//! [`crate::plan::split_warm`] cuts). P1 then reports `warm` and waits. No step's code has
//! run in it, nothing of a project is visible in it, and it holds no capability a cold init
//! would not hold at the same point.
//!
//! `create` claims one when the sandbox's configuration is one a warm sandbox can serve
//! ([`eligible`]: no network, no egress policy, no disk or CPU limit, no volumes): the
//! warm cgroups get the step's memory and pids limits and become the sandbox's, and the
//! init stays attached to the sandbox until its first `execute`. There the step's plan is
//! compiled as for a cold start and its prefix compared, op by op, with what the warm
//! sandbox built (and its prelude with the cold one's): only when they are equal is the
//! rest sent to the waiting P1; otherwise the warm init is dropped and a cold one started
//! in the same cgroups. A warm sandbox is thus never anything but the cold one the same
//! plan would have made, a few seconds earlier.
//!
//! A keeper thread refills the pool to its size after every claim. Dropping the runtime
//! closes every warm init's control socket, which makes its P0 kill P1, and removes their
//! cgroups.
//!
//! When a pool's steps repeat one configuration (the same one claimed twice in a row: a
//! workflow's steps on one project), the keeper also arms its sandboxes for it: the rest of
//! the plan too is done ahead, up to the command (see [`crate::armed`]). A claim takes one
//! armed for its configuration first, else one not armed; a claim of another configuration
//! stops the arming, and the armed ones are discarded and replaced by plain ones.

/// A warm sandbox, made and claimed.
mod sandbox;

pub(crate) use sandbox::{eligible, eligible_controls, ClaimedWarm, PreForked, WarmSandbox};
use sandbox::{make, reap};

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::armed::{self, ArmKey};
use crate::cgroup::CgroupLimits;
use crate::host::{Defaults, HostCaps};
use crate::launcher::ZygoteSlot;

/// How long the keeper holds off after a claim, unless the claiming step's command starts
/// sooner (see [`WarmPool::step_started`]): making the next warm sandbox takes a few
/// milliseconds of CPU, which must not compete with the start of the step that claimed one.
const HOLD_AFTER_CLAIM: Duration = Duration::from_millis(250);

/// With [`WarmPool::refill_when_steps_end`]: the longest the keeper holds off after a claim
/// when nobody says the step is over (a caller that forgot, or a step that runs long).
const HOLD_UNTIL_STEP_OVER: Duration = Duration::from_secs(5);

/// How long the keeper waits after a failure before it tries again (doubling to a minute).
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(60);
/// How long a configuration whose arming failed is not armed for again: a failure may pass (a
/// full disk, a busy cgroup), and steps meanwhile start cold, which costs only time. The keeper
/// looks again at its next wake-up after that (a claim wakes it).
const UNARMABLE_FOR: Duration = Duration::from_secs(30);
/// What a pool's thread runs before it makes sandboxes ([`WarmPool::start_once`]).
pub(crate) type Setup =
    Box<dyn FnOnce() -> Result<(Arc<HostCaps>, CgroupLimits), String> + Send + 'static>;

/// The pool: its warm sandboxes and the keeper that refills it.
#[derive(Debug)]
pub(crate) struct WarmPool {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<PoolState>,
    changed: Condvar,
    size: usize,
    /// Keep the pool at its size (`false`: make `size` sandboxes once, then stop; see
    /// [`WarmPool::start_once`]).
    refill: bool,
    /// The runtime's default limits, for arming (see [`crate::armed`]); `None`: the pool
    /// never arms.
    arming: Option<Defaults>,
}

#[derive(Debug, Default)]
struct PoolState {
    ready: Vec<WarmSandbox>,
    stop: bool,
    /// Why the last attempt to make one failed (cleared by a success).
    last_error: Option<String>,
    /// Sandboxes made since the pool started, and how many were claimed.
    made: u64,
    claimed: u64,
    /// Of those, how many were armed.
    claimed_armed: u64,
    /// Of those, how many served their step's command (see [`WarmPool::step_started`]).
    served_armed: u64,
    /// No refill before this (see [`HOLD_AFTER_CLAIM`]).
    hold_until: Option<Instant>,
    /// Hold the refill until the claiming step is over, not just started (see
    /// [`WarmPool::refill_when_steps_end`]).
    refill_when_steps_end: bool,
    /// The keeper is making one now.
    making: bool,
    /// The configuration of the last claim, and the one new sandboxes are armed for: the
    /// last claim's when it was the one before's too (see [`crate::armed`]).
    last_key: Option<ArmKey>,
    template: Option<ArmKey>,
    /// A configuration whose arming failed, and when: not tried again for [`UNARMABLE_FOR`].
    unarmable: Option<(ArmKey, Instant)>,
    /// Why the last arming failed.
    last_arm_error: Option<String>,
    /// Why the last claimed armed sandbox could not be adopted (its step started cold).
    last_adopt_error: Option<String>,
    /// Armed sandboxes no claim will take any more, for the keeper to discard.
    stale: Vec<WarmSandbox>,
}

/// What the pool holds, for `doctor`, tests and the bench.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmStatus {
    pub size: usize,
    pub ready: usize,
    pub made: u64,
    pub claimed: u64,
    pub last_error: Option<String>,
    /// How many of the ready ones are armed for a configuration, how many claims took an
    /// armed one, and why the last arming failed.
    pub armed: usize,
    pub claimed_armed: u64,
    /// How many steps' commands ran in the armed init their sandbox claimed (a claimed one
    /// whose plan differed at execute is given up, and not counted).
    pub served_armed: u64,
    pub last_arm_error: Option<String>,
    /// Why the last claimed armed sandbox could not be adopted, its step starting cold.
    pub last_adopt_error: Option<String>,
    /// The waiting sandboxes: their init's (P0's) pid and their cgroup directories.
    pub waiting: Vec<(i32, Vec<std::path::PathBuf>)>,
}

impl WarmPool {
    /// Starts the keeper, which makes `size` warm sandboxes and keeps the pool at that size.
    pub(crate) fn start(
        size: usize,
        caps: Arc<HostCaps>,
        zygote: ZygoteSlot,
        limits: CgroupLimits,
        defaults: Defaults,
    ) -> WarmPool {
        Self::start_with(
            size,
            Some(defaults),
            move || Ok((caps, limits)),
            zygote,
            None,
        )
    }

    /// A pool of one warm sandbox made at once and never refilled: for a process that runs
    /// one step (the CLI's `run`), so that the sandbox is made on the other core while the
    /// process opens its store and records the step, and [`WarmPool::claim_waiting`] takes
    /// it when `create` comes.
    /// `setup` runs first on the pool's thread: what the host has and the warm sandbox's
    /// limits, or why it cannot have one.
    ///
    /// With `preforked`, that init is the one made warm (instead of one forked by the
    /// zygote), and the pool's thread then waits for it to end, to reap it.
    pub(crate) fn start_once(
        setup: Setup,
        zygote: ZygoteSlot,
        preforked: Option<PreForked>,
    ) -> WarmPool {
        Self::start_with(1, None, setup, zygote, preforked)
    }

    /// A pool that refills and arms with `arming`, or makes `size` once and never arms.
    fn start_with(
        size: usize,
        arming: Option<Defaults>,
        setup: impl FnOnce() -> Result<(Arc<HostCaps>, CgroupLimits), String> + Send + 'static,
        zygote: ZygoteSlot,
        preforked: Option<PreForked>,
    ) -> WarmPool {
        let shared = Arc::new(Shared {
            state: Mutex::new(PoolState {
                // Said before the keeper runs, so that a claim coming first waits for it.
                making: true,
                ..PoolState::default()
            }),
            changed: Condvar::new(),
            size,
            refill: arming.is_some(),
            arming,
        });
        let keeper = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("smithers-warm-pool".into())
            .spawn(move || {
                let ours = preforked.as_ref().map(|p| p.init.pid);
                match setup() {
                    Ok((caps, limits)) => keep(&keeper, &caps, &zygote, &limits, preforked),
                    Err(e) => {
                        // An init forked for us ends at the end of its input (dropped here).
                        drop(preforked);
                        let mut state = keeper.lock();
                        state.last_error = Some(e);
                        state.making = false;
                        drop(state);
                        keeper.changed.notify_all();
                    }
                }
                if let Some(pid) = ours {
                    reap(pid);
                }
            });
        if let Err(e) = spawned {
            let mut state = shared.lock();
            state.last_error = Some(format!("could not start the pool's keeper: {e}"));
            state.making = false;
        }
        WarmPool { shared }
    }

    /// [`WarmPool::claim`], waiting up to `patience` for the sandbox the keeper is making
    /// when none is ready (making one takes a few milliseconds; starting cold instead would
    /// take as long, on the critical path).
    pub(crate) fn claim_waiting(&self, patience: Duration) -> Option<WarmSandbox> {
        self.shared
            .wait_while(patience, |s| s.ready.is_empty() && s.making && !s.stop);
        self.claim(None)
    }

    /// A waiting warm sandbox for a sandbox of `key`, if the pool has one (the keeper then
    /// makes another): one armed for `key`, else one not armed. The claim also teaches the
    /// pool what to arm for (see [`crate::armed`]).
    pub(crate) fn claim(&self, key: Option<&ArmKey>) -> Option<WarmSandbox> {
        let mut dead = Vec::new();
        let found = {
            let mut state = self.shared.lock();
            let state = &mut *state;
            if let (Some(key), Some(_)) = (key, self.shared.arming) {
                if state.last_key.as_ref() == Some(key) {
                    state.template = Some(key.clone());
                } else if state.template.as_ref() != Some(key) {
                    state.template = None;
                }
                state.last_key = Some(key.clone());
            }
            let mut i = 0;
            while i < state.ready.len() {
                let sandbox = &state.ready[i];
                let stale = sandbox.armed.as_ref().is_some_and(|a| {
                    state.template.as_ref().is_none_or(|t| !a.armed_for(t))
                        || key.is_some_and(|k| a.armed_for(k) && !a.serves(k))
                });
                if !sandbox.waiting() {
                    dead.push(state.ready.swap_remove(i));
                } else if stale {
                    state.stale.push(state.ready.swap_remove(i));
                } else {
                    i += 1;
                }
            }
            let serves = |w: &WarmSandbox| match (&w.armed, key) {
                (Some(a), Some(k)) => a.serves(k),
                _ => false,
            };
            let found = state
                .ready
                .iter()
                .position(serves)
                .or_else(|| state.ready.iter().position(|w| w.armed.is_none()))
                .map(|at| state.ready.swap_remove(at));
            if let Some(found) = &found {
                state.claimed += 1;
                state.claimed_armed += u64::from(found.armed.is_some());
                let hold = if state.refill_when_steps_end {
                    HOLD_UNTIL_STEP_OVER
                } else {
                    HOLD_AFTER_CLAIM
                };
                state.hold_until = Some(Instant::now() + hold);
            }
            found
        };
        self.shared.changed.notify_all();
        for sandbox in dead {
            sandbox.discard();
        }
        found
    }

    /// A claimed armed sandbox could not be adopted (see `adopt_armed`): its step started
    /// cold. `status` reports why.
    pub(crate) fn adopt_failed(&self, why: String) {
        self.shared.lock().last_adopt_error = Some(why);
    }

    /// The command of a step that claimed a warm sandbox has started, in the armed init it
    /// claimed if `armed_served`: the keeper may refill.
    pub(crate) fn step_started(&self, armed_served: bool) {
        let mut state = self.shared.lock();
        if !state.refill_when_steps_end {
            state.hold_until = None;
        }
        state.served_armed += u64::from(armed_served);
        drop(state);
        self.shared.changed.notify_all();
    }

    /// From now on the pool refills after a claim only once the step is over
    /// ([`WarmPool::step_over`]), not as soon as its command starts (or after
    /// [`HOLD_UNTIL_STEP_OVER`] at the latest).
    pub(crate) fn refill_when_steps_end(&self) {
        self.shared.lock().refill_when_steps_end = true;
    }

    /// The step that claimed the last sandbox is over: the keeper may refill.
    pub(crate) fn step_over(&self) {
        self.shared.lock().hold_until = None;
        self.shared.changed.notify_all();
    }

    pub(crate) fn status(&self) -> WarmStatus {
        let state = self.shared.lock();
        WarmStatus {
            size: self.shared.size,
            ready: state.ready.len(),
            made: state.made,
            claimed: state.claimed,
            last_error: state.last_error.clone(),
            armed: state.ready.iter().filter(|w| w.armed.is_some()).count(),
            claimed_armed: state.claimed_armed,
            served_armed: state.served_armed,
            last_arm_error: state.last_arm_error.clone(),
            last_adopt_error: state.last_adopt_error.clone(),
            waiting: state
                .ready
                .iter()
                .map(|w| {
                    let dirs = w.cgroups.dirs.iter().map(|d| d.path.clone()).collect();
                    (w.init.pid, dirs)
                })
                .collect(),
        }
    }

    /// Waits until the pool is full, or `timeout` passes; returns the status then.
    pub(crate) fn wait_full(&self, timeout: Duration) -> WarmStatus {
        let size = self.shared.size;
        self.shared
            .wait_while(timeout, |s| s.ready.len() < size && s.last_error.is_none());
        self.status()
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits while `waiting` holds of the pool's state, woken by every change, for at most
    /// `timeout`.
    fn wait_while(&self, timeout: Duration, waiting: impl FnMut(&mut PoolState) -> bool) {
        let state = self.lock();
        drop(
            self.changed
                .wait_timeout_while(state, timeout, waiting)
                .unwrap_or_else(|p| p.into_inner()),
        );
    }
}

impl Drop for WarmPool {
    fn drop(&mut self) {
        // The stale ones too: the keeper stops without discarding what it had not yet.
        let ready = {
            let mut state = self.shared.lock();
            state.stop = true;
            let mut ready = std::mem::take(&mut state.ready);
            ready.append(&mut state.stale);
            ready
        };
        self.shared.changed.notify_all();
        for sandbox in ready {
            sandbox.discard();
        }
    }
}

/// The configuration the keeper arms for now, if any (see [`crate::armed`]).
fn armable_template(shared: &Shared, state: &PoolState) -> Option<ArmKey> {
    shared.arming?;
    state.template.clone().filter(|t| {
        !matches!(&state.unarmable,
                Some((failed, at)) if failed == t && at.elapsed() < UNARMABLE_FOR)
    })
}

/// The keeper's loop: make warm sandboxes while the pool is short of its size, and arm them
/// for the configuration its steps repeat.
fn keep(
    shared: &Shared,
    caps: &HostCaps,
    zygote: &ZygoteSlot,
    limits: &CgroupLimits,
    mut preforked: Option<PreForked>,
) {
    if shared.arming.is_some() {
        armed::sweep(caps);
    }
    let mut retry = RETRY_FIRST;
    loop {
        // A ready sandbox not armed, taken out to be armed (rather than a new one made).
        let mut existing = None;
        {
            let mut state = shared.lock();
            loop {
                let done = !shared.refill
                    && (state.made >= shared.size as u64 || state.last_error.is_some());
                if state.stop || done {
                    state.making = false;
                    drop(state);
                    shared.changed.notify_all();
                    return;
                }
                if !state.stale.is_empty() {
                    let stale = std::mem::take(&mut state.stale);
                    drop(state);
                    for sandbox in stale {
                        sandbox.discard();
                    }
                    state = shared.lock();
                    continue;
                }
                let held = state
                    .hold_until
                    .map(|until| until.saturating_duration_since(Instant::now()))
                    .filter(|left| !left.is_zero());
                // With a configuration to arm for, a ready sandbox not armed is armed in place
                // (a full pool of plain ones would otherwise never be).
                let armable = armable_template(shared, &state).is_some();
                let plain = state.ready.iter().position(|w| w.armed.is_none());
                match held {
                    None if armable && plain.is_some() => {
                        existing = plain.map(|at| state.ready.swap_remove(at));
                        break;
                    }
                    _ if state.ready.len() >= shared.size => {
                        state = shared
                            .changed
                            .wait(state)
                            .unwrap_or_else(|p| p.into_inner())
                    }
                    Some(left) => {
                        state = shared
                            .changed
                            .wait_timeout(state, left)
                            .map(|(s, _)| s)
                            .unwrap_or_else(|p| p.into_inner().0)
                    }
                    None => break,
                }
            }
            state.making = true;
        }
        let template = armable_template(shared, &shared.lock());
        let fresh = existing.is_none();
        let made = match existing {
            Some(sandbox) => Ok(sandbox),
            None => make(caps, zygote, limits, preforked.take()),
        };
        let made = match (made, template, shared.arming) {
            (Ok(mut sandbox), Some(template), Some(defaults)) => {
                let to_arm = armed::ToArm {
                    control: &sandbox.control,
                    cgroups: &sandbox.cgroups,
                    prelude: &sandbox.prelude,
                    plan: &sandbox.plan,
                };
                match armed::arm(caps, defaults, &to_arm, &template) {
                    Ok(armed) => {
                        sandbox.armed = Some(armed);
                        Ok(sandbox)
                    }
                    Err(e) => {
                        sandbox.discard();
                        let mut state = shared.lock();
                        state.last_arm_error = Some(e);
                        state.unarmable = Some((template, Instant::now()));
                        state.making = false;
                        drop(state);
                        shared.changed.notify_all();
                        continue;
                    }
                }
            }
            (made, _, _) => made,
        };
        match made {
            Ok(sandbox) => {
                retry = RETRY_FIRST;
                let mut state = shared.lock();
                if state.stop {
                    drop(state);
                    sandbox.discard();
                    return;
                }
                if sandbox.armed.is_some() {
                    state.last_arm_error = None;
                }
                state.ready.push(sandbox);
                state.made += u64::from(fresh);
                state.last_error = None;
                state.making = false;
                drop(state);
                shared.changed.notify_all();
            }
            Err(e) => {
                {
                    let mut state = shared.lock();
                    state.last_error = Some(e);
                    state.making = false;
                }
                shared.changed.notify_all();
                if !shared.refill {
                    return;
                }
                // Wait before the next try, waking early only to stop.
                let state = shared.lock();
                drop(
                    shared
                        .changed
                        .wait_timeout_while(state, retry, |s| !s.stop)
                        .map(|(s, _)| s),
                );
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }
}
