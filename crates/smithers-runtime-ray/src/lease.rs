//! What a lease is on the engine's side: its submission id, the job it submits (the
//! entrypoint that starts `smithers-sandbox serve` on the node, its resources, its token), and
//! how the node's address is read back from the job.

use std::collections::BTreeMap;

use serde_json::json;
use smithers_runtime::SandboxConfig;

use crate::jobs::JobSubmit;
use crate::options::RayOptions;

/// The job environment variable that carries the lease's token to the node. The entrypoint
/// moves it to `SMITHERS_SANDBOX_TOKEN` and removes it (and Ray's own token) from what `serve`
/// and therefore the step sees.
pub const LEASE_TOKEN_ENV: &str = "SMITHERS_LEASE_TOKEN";

/// The job metadata keys a lease is recognised by.
pub const META_RUN_ID: &str = "smithers_run_id";
pub const META_SANDBOX_ID: &str = "smithers_sandbox_id";
pub const META_POOL: &str = "smithers_pool";

/// The line `serve` prints once it listens: the lease's port is read from it.
const SERVING_PREFIX: &str = "smithers-sandbox serving on http://";

/// The submission id of the lease of one sandbox: derived from its ids alone, so that creating
/// the same sandbox twice (from any process) names the same job and Ray refuses the second,
/// and a process that finds only the row can still name the job to stop.
pub fn submission_id(run_id: &str, sandbox_id: &str) -> String {
    // Both ids are [A-Za-z0-9._-]{1,128} (checked by SandboxConfig::validate). The run id's
    // length makes the split unambiguous (`a--b`/`c` and `a`/`b--c` differ), and the `r`
    // keeps cold ids apart from warm ones (`smithers-warm-`).
    format!("{SUBMISSION_PREFIX}r{}-{run_id}-{sandbox_id}", run_id.len())
}

/// Whether `id` has exactly the shape of a warm lease's id ([`warm_id`]).
pub fn is_warm_id(id: &str) -> bool {
    id.strip_prefix(WARM_PREFIX).is_some_and(|rest| {
        rest.len() == 32
            && rest
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    })
}

/// Every lease's submission id starts with this.
pub const SUBMISSION_PREFIX: &str = "smithers-";
/// A warm lease's submission id starts with this (then a random id: it has no sandbox yet).
pub const WARM_PREFIX: &str = "smithers-warm-";
/// A claim record's metadata key naming the warm lease it claimed.
pub const META_CLAIM_OF: &str = "smithers_claim_of";

/// A fresh warm lease id.
pub fn warm_id() -> String {
    format!("{WARM_PREFIX}{}", uuid::Uuid::new_v4().simple())
}

/// Quotes `text` for a POSIX shell (Ray runs the entrypoint with `sh -c`).
pub fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The job a lease submits for `config`.
pub fn job_for(
    options: &RayOptions,
    config: &SandboxConfig,
    submission_id: &str,
    token: &str,
) -> JobSubmit {
    let mut job = serve_job(
        options,
        Some(&config.controls),
        submission_id,
        token,
        options.lease_idle_exit,
    );
    job.metadata
        .insert(META_RUN_ID.to_string(), config.run_id.clone());
    job.metadata
        .insert(META_SANDBOX_ID.to_string(), config.sandbox_id.clone());
    job
}

/// A warm lease: a server for whichever step claims it, with the server's default ceilings
/// and no reservation beyond the slot (so only a step that asks no CPU or memory of its own
/// may claim it: [`fits_warm`]). It gives its slot back when unclaimed for
/// `warm_idle_exit`.
pub fn warm_job(options: &RayOptions, id: &str, token: &str) -> JobSubmit {
    let mut job = serve_job(options, None, id, token, options.warm_idle_exit);
    job.metadata.insert("smithers_warm".into(), "1".into());
    job
}

/// Whether a step's controls fit a warm lease: no CPU or memory reservation of its own (the
/// lease reserved none), no network (its server does not allow it), and within its server's
/// default ceilings (`serve`'s: 4096 pids, 16g disk, 1h, 16m output).
pub fn fits_warm(c: &smithers_runtime::Controls) -> bool {
    c.memory_limit_bytes.is_none()
        && c.cpu_limit.is_none()
        && !c.allow_network
        && c.pids_limit.is_none_or(|p| p <= 4096)
        && c.disk_limit_bytes.is_none_or(|d| d <= 16 << 30)
        && c.timeout_ms.is_none_or(|t| t <= 3_600_000)
        && c.max_output_bytes <= 16 << 20
}

/// The claim record of a warm lease for a sandbox: a job under the sandbox's derived id (so a
/// second create of it is refused by Ray, as for a cold lease) that runs `true` on no
/// resources and names the warm lease in its metadata.
pub fn claim_job(config: &SandboxConfig, submission_id: &str, warm: &str) -> JobSubmit {
    let mut metadata = BTreeMap::new();
    metadata.insert(META_RUN_ID.to_string(), config.run_id.clone());
    metadata.insert(META_SANDBOX_ID.to_string(), config.sandbox_id.clone());
    metadata.insert(META_CLAIM_OF.to_string(), warm.to_string());
    JobSubmit {
        entrypoint: "true".into(),
        submission_id: submission_id.to_string(),
        runtime_env: json!({}),
        metadata,
        entrypoint_num_cpus: None,
        entrypoint_memory: None,
        entrypoint_resources: BTreeMap::new(),
        entrypoint_label_selector: BTreeMap::new(),
    }
}

/// A job running `serve`: with `step`, that step's limits are the server's ceilings and the
/// lease's reservation; without, the server keeps its defaults and nothing but the slot is
/// reserved (a warm lease).
fn serve_job(
    options: &RayOptions,
    step: Option<&smithers_runtime::Controls>,
    submission_id: &str,
    token: &str,
    idle_exit: std::time::Duration,
) -> JobSubmit {
    let none = smithers_runtime::Controls::default();
    let c = step.unwrap_or(&none);
    // A name nobody can guess ahead (a node's other users share /tmp), made by the
    // entrypoint with mode 0700 and refused if it exists already.
    let data_dir = format!(
        "{}/smithers-lease-{}",
        options.node_state_dir,
        uuid::Uuid::new_v4().simple()
    );
    let mut serve: Vec<String> = vec![
        options.serve_binary.clone(),
        "serve".into(),
        "--listen".into(),
        options.node_listen.clone(),
        "--data-dir".into(),
        data_dir.clone(),
        "--orphan-timeout-ms".into(),
        options.orphan_timeout.as_millis().to_string(),
        // One lease, one sandbox.
        "--max-sandboxes".into(),
        "1".into(),
        "--max-sandboxes-per-token".into(),
        "1".into(),
        // A lease nobody uses gives its slot back.
        "--exit-when-idle".into(),
        format!("{}ms", idle_exit.as_millis().max(1)),
    ];
    // The node's ceilings are the step's own limits: the lease reserved them from Ray.
    if step.is_some() {
        serve.extend(["--max-output".into(), format!("{}b", c.max_output_bytes)]);
    }
    if let Some(m) = c.memory_limit_bytes {
        serve.extend(["--max-memory".into(), format!("{m}b")]);
    }
    if let Some(cpu) = c.cpu_limit {
        serve.extend(["--max-cpus".into(), cpu.to_string()]);
    }
    if let Some(p) = c.pids_limit {
        serve.extend(["--max-pids".into(), p.to_string()]);
    }
    if let Some(d) = c.disk_limit_bytes {
        serve.extend(["--max-disk".into(), format!("{d}b")]);
    }
    if let Some(t) = c.timeout_ms {
        serve.extend(["--max-timeout".into(), format!("{t}ms")]);
    }
    if c.allow_network {
        serve.push("--allow-network".into());
    }
    let serve = serve
        .iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ");
    // `env -u`: neither Ray's cluster token nor the job's config (which repeats the lease
    // token) reaches `serve`, and so neither can reach a step.
    // The nonce line first: this lease's serving line is the one after it (Ray appends to the
    // log of a reused submission id).
    let entrypoint = format!(
        "echo \"{NONCE_PREFIX}${LEASE_NONCE_ENV}\"; mkdir -m 700 {dir} || exit 1; SMITHERS_SANDBOX_TOKEN=\"${LEASE_TOKEN_ENV}\" exec env -u {LEASE_TOKEN_ENV} \
         -u {LEASE_NONCE_ENV} -u RAY_AUTH_TOKEN -u RAY_AUTH_TOKEN_PATH -u RAY_JOB_CONFIG_JSON_ENV_VAR -u RAY_ADDRESS {serve}",
        dir = shell_quote(&data_dir),
    );
    let mut resources = BTreeMap::new();
    resources.insert(options.slot_resource.clone(), 1.0);
    let mut labels = BTreeMap::new();
    if let Some(pool) = &options.pool {
        labels.insert(options.pool_label.clone(), pool.clone());
    }
    let mut metadata = BTreeMap::new();
    if let Some(pool) = &options.pool {
        metadata.insert(META_POOL.to_string(), pool.clone());
    }
    JobSubmit {
        entrypoint,
        submission_id: submission_id.to_string(),
        runtime_env: json!({ "env_vars": {
            LEASE_TOKEN_ENV: token,
            LEASE_NONCE_ENV: uuid::Uuid::new_v4().simple().to_string(),
        } }),
        metadata,
        entrypoint_num_cpus: c.cpu_limit,
        entrypoint_memory: c.memory_limit_bytes,
        entrypoint_resources: resources,
        entrypoint_label_selector: labels,
    }
}

/// The job environment variable holding the lease's nonce, which its entrypoint prints first.
pub const LEASE_NONCE_ENV: &str = "SMITHERS_LEASE_NONCE";
const NONCE_PREFIX: &str = "smithers-lease ";

/// The port `serve` listens on, from the lease's log: the first serving line after the line
/// with this lease's `nonce` (Ray appends to the log of a submission id used before, so an
/// earlier lease of the same sandbox may have printed one first; a step's output never
/// reaches this log: `serve` keeps it in its own event log).
pub fn serving_port(log: &str, nonce: &str) -> Option<u16> {
    let marker = format!("{NONCE_PREFIX}{nonce}");
    let mut lines = log.lines();
    lines.by_ref().find(|l| l.trim() == marker)?;
    lines.find_map(|line| {
        let rest = line.trim().strip_prefix(SERVING_PREFIX)?;
        let authority = rest.split([' ', '/']).next()?;
        authority.rsplit_once(':')?.1.parse().ok()
    })
}

/// Whether `record` is the job `job` submitted (not another submit under the same id): the
/// same lease nonce, or for a claim record the same warm lease. Both are fresh per submit.
pub fn same_submission(record: &crate::jobs::JobRecord, job: &JobSubmit) -> bool {
    let nonce = job
        .runtime_env
        .get("env_vars")
        .and_then(|v| v.get(LEASE_NONCE_ENV))
        .and_then(|v| v.as_str());
    if let Some(nonce) = nonce {
        return record.env_var(LEASE_NONCE_ENV) == Some(nonce);
    }
    match job.metadata.get(META_CLAIM_OF) {
        Some(warm) => record.metadata.as_ref().and_then(|m| m.get(META_CLAIM_OF)) == Some(warm),
        None => false,
    }
}

/// A fresh lease token (256 bits).
pub fn new_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_is_read_from_the_serving_line() {
        let log = "Running entrypoint for job x: ...\nsmithers-lease n1\nrecovered nothing\nsmithers-sandbox serving on http://0.0.0.0:41235 (data in /tmp/d)\n";
        assert_eq!(serving_port(log, "n1"), Some(41235));
        assert_eq!(serving_port("smithers-lease n1\nnothing yet\n", "n1"), None);
        // A reused submission id's log holds the earlier lease's lines first; until this
        // lease's server speaks, there is no port (not the earlier one's).
        let reused = "smithers-lease n0\nsmithers-sandbox serving on http://0.0.0.0:1111 (data in /d)\nsmithers-lease n1\n";
        assert_eq!(serving_port(reused, "n1"), None);
        let reused =
            format!("{reused}smithers-sandbox serving on http://0.0.0.0:2222 (data in /d)\n");
        assert_eq!(serving_port(&reused, "n1"), Some(2222));
        assert_eq!(serving_port(&reused, "n0"), Some(1111));
        assert_eq!(
            serving_port(
                "smithers-lease n\nsmithers-sandbox serving on http://[::]:7 (data in /x)",
                "n"
            ),
            Some(7)
        );
    }

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(shell_quote("a'b"), r"'a'\''b'");
        assert_eq!(shell_quote("/usr/bin/x y"), "'/usr/bin/x y'");
    }

    #[test]
    fn submission_ids_are_derived_from_the_ids() {
        assert_eq!(submission_id("run-1", "sbx.2"), "smithers-r5-run-1-sbx.2");
        assert_ne!(submission_id("a--b", "c"), submission_id("a", "b--c"));
        assert!(is_warm_id(&warm_id()));
        assert!(!is_warm_id("smithers-warm-x--y"));
        assert!(!is_warm_id(&submission_id("warm-x", "y")));
    }
}
