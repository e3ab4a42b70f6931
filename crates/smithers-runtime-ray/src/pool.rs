//! The warm pool's state: the warm leases that are ready ([`WarmLease`]) and what the pool
//! is starting and owns ([`Pool`]). Plain data the runtime holds and `crate::warm` (the
//! pool's filling and claiming, methods of the runtime) changes: kept below both so that the
//! runtime does not use the module that uses it back.

use std::collections::VecDeque;
use std::time::Instant;

use smithers_runtime_remote::RemoteRuntime;

use crate::jobs::JobRecord;

/// A warm lease whose server is up.
#[derive(Debug, Clone)]
pub(crate) struct WarmLease {
    pub id: String,
    pub remote: RemoteRuntime,
    pub node_ip: String,
    pub record: JobRecord,
    /// When its server said it listens: its `--exit-when-idle` clock runs from about then.
    pub ready_at: Instant,
}

/// The ready leases and how many are being started.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    pub(crate) ready: VecDeque<WarmLease>,
    pub(crate) starting: usize,
    /// Ids of every warm lease this pool started and has not handed out or ended.
    pub(crate) owned: Vec<String>,
    /// Shut down: nothing more is started, and a start that finishes now is ended.
    pub(crate) closed: bool,
}
