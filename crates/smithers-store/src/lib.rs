//! The durable state of smithers-sandbox: one SQLite file (WAL, embedded, no server).
//!
//! - `_smithers_sandboxes` and `_smithers_events`, column for column the tables of the
//!   JavaScript package (spec section 6), so either side reads what the other wrote.
//! - Tables of our own: owner leases (crash recovery), reviews and their patches.
//! - The atomic concurrency gate ([`Store::try_admit`]): count and insert in ONE `BEGIN
//!   IMMEDIATE` transaction, so N parallel starts never exceed the limit.
//!
//! A [`Store`] keeps a small pool of connections: each call takes one of its own (opening
//! another when all are in use) and gives it back, so callers on different threads do not
//! wait for each other's calls: WAL lets readers go on beside a writer, and a write waiting
//! for another one's lock holds only its own connection. It is `Send + Sync` and meant to be
//! shared in an `Arc`. Several processes (or several `Store`s, or several connections of one)
//! may use the same file at once: every write that reads before it writes runs in an
//! IMMEDIATE transaction, and `busy_timeout` makes the others wait instead of failing.
//!
//! Durability: commits run with `synchronous = NORMAL` (written to the WAL, not synced), and
//! a closing connection does not checkpoint; instead dropping a [`Store`] (or
//! [`Store::sync_wal`]) fsyncs the WAL, so what a store committed survives a power loss once
//! it is dropped, at one fsync per process instead of a checkpoint's two and the WAL's
//! unlink and re-creation. SQLite's automatic checkpoint at commit keeps the WAL bounded.
#![forbid(unsafe_code)]

mod error;
mod events;
mod field;
mod gate;
mod leases;
mod limits;
mod owner;
mod redact;
mod reviews;
mod runs;
mod sandboxes;
mod schema;
mod store;

pub use error::{GateScope, Result, StoreError};
pub use events::{EventRow, NewEvent, EVENT_POLL_INTERVAL};
pub use field::Field;
pub use gate::{AdmitRequest, Admitted};
pub use leases::{Lease, Orphan};
pub use limits::{parse_limit, parse_max_concurrent, DEFAULT_MAX_CONCURRENT_SANDBOXES};
pub use owner::{effective_uid, Liveness, OwnerIdentity};
pub use redact::{redact_config, RedactedConfig, REDACTED};
pub use reviews::{
    NewReview, PatchOperation, PatchRecord, ReviewRow, ReviewState, APPLIED_BY_CALLER,
};
pub use runs::{CliRunStart, RunStatus, CLI_WORKFLOW_NAME};
pub use sandboxes::{SandboxRow, SandboxStatus, SandboxUpsert};
pub use schema::SCHEMA_VERSION;
pub use store::{Store, BUSY_TIMEOUT};
