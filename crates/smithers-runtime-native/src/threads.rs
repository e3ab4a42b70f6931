//! Where the blocking parts of the verbs run: off the async workers ([`blocking`]), and side
//! by side ([`beside`]).

use smithers_runtime::RuntimeError;

/// Jobs started by [`beside`]; `wait` returns their results in order.
pub(crate) struct Beside<T> {
    results: Vec<std::sync::mpsc::Receiver<T>>,
}

impl<T> Beside<T> {
    pub(crate) fn wait(self) -> Vec<Option<T>> {
        self.results.into_iter().map(|r| r.recv().ok()).collect()
    }
}

/// Starts each job on another thread: the tokio runtime's blocking pool when called within
/// one (its threads are already started; a new thread took 0.1–0.3 ms to get going here),
/// else a thread of its own.
pub(crate) fn beside<T, F>(jobs: impl IntoIterator<Item = F>) -> Beside<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let pool = tokio::runtime::Handle::try_current().ok();
    let results = jobs
        .into_iter()
        .map(|job| {
            let (tx, rx) = std::sync::mpsc::channel();
            let run = move || {
                let _ = tx.send(job());
            };
            match &pool {
                Some(pool) => drop(pool.spawn_blocking(run)),
                None => drop(std::thread::spawn(run)),
            }
            rx
        })
        .collect();
    Beside { results }
}

/// Runs the blocking part of a verb (file system walks, fsyncs, the zygote's answer, the
/// sleep loops of cgroup kills and busy removals) so that no async worker waits on it: in
/// `serve`, one slow sandbox must not stall the HTTP, event and watchdog tasks of every
/// other. On a multi-thread runtime that is `block_in_place`: on a worker, tokio first hands
/// the worker's other tasks to another thread; on the thread of a `block_on` (the CLI's `run`
/// and the resident service drive their one step there, and no task waits on that thread)
/// the job simply runs, without the two thread hand-offs of the blocking pool (~0.15 ms of a
/// served step). A current-thread runtime has no other thread to hand its tasks to: the job
/// goes to the blocking pool. A panic there is a panic of the verb, as it was inline;
/// `operation` names the failure when the runtime is shutting down and a job sent to the
/// blocking pool cannot run.
pub(crate) async fn blocking<T, F>(operation: &'static str, job: F) -> Result<T, RuntimeError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread) {
        return Ok(tokio::task::block_in_place(job));
    }
    match tokio::task::spawn_blocking(job).await {
        Ok(value) => Ok(value),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(RuntimeError::spawn(operation, e)),
    }
}
