//! The `ship` verb: the request, written where the handle and the sandbox read it, and in
//! copy mode the copy of the project the step will see.

use smithers_runtime::{RequestBundle, RuntimeError, SandboxHandle, ShipReport};

use crate::backend::Backend;
use crate::copy;
use crate::files::{io_err, remove_tree, write_private};
use crate::plan;

/// The `ship` verb.
pub(crate) async fn ship(
    handle: &SandboxHandle,
    request: &RequestBundle,
) -> Result<ShipReport, RuntimeError> {
    let backend = Backend::from_handle(handle, "ship")?;
    if !backend.state_dir.is_dir() {
        return Err(RuntimeError::OutOfOrder {
            verb: "ship",
            reason: "the sandbox does not exist (cleaned up?)".into(),
        });
    }
    let bytes = serde_json::to_vec(&request.request).map_err(|e| RuntimeError::InvalidControl {
        control: "request",
        reason: e.to_string(),
    })?;
    std::fs::create_dir_all(&handle.request_path)
        .map_err(io_err("create", &handle.request_path))?;
    let path = handle.request_path.join(plan::REQUEST_FILE_NAME);
    write_private(&path, &bytes)?;
    // The copy the sandbox reads (`Backend::request_dir`); made here too for a handle
    // from before it existed.
    let shown = backend.request_dir();
    std::fs::create_dir_all(&shown).map_err(io_err("create", &shown))?;
    write_private(&shown.join(plan::REQUEST_FILE_NAME), &bytes)?;
    // An overlay needs no shipping: its lower layer is the project itself. A copy is made
    // now (once: a second ship keeps the copy the step may already have changed). The
    // reported size stays the request's (the spec's bundleSizeBytes); what the copy cost
    // is in the workspace record of the log.
    if backend.workspace.copy_reason().is_some() {
        ship_copy(&backend).await?;
    }
    Ok(ShipReport {
        bundle_size_bytes: bytes.len() as u64,
    })
}

/// Makes the workspace copy of copy mode (in a blocking task: it reads the whole project)
/// and records what it copied in `copy-report.json` for the log. Copies into a scratch name
/// and renames, so an interrupted ship never leaves a partial copy that a later one would
/// take for complete.
async fn ship_copy(backend: &Backend) -> Result<(), RuntimeError> {
    let copy = backend.copy();
    if copy.is_dir() {
        return Ok(());
    }
    let partial = backend.layer().join("copy.partial");
    let root = backend.root_dir.clone();
    let manifest_file = backend.copy_manifest_file();
    let task = tokio::task::spawn_blocking(move || {
        remove_tree(&partial).map_err(io_err("remove a partial workspace copy", &partial))?;
        let mut manifest = smithers_patch::CopyManifestWriter::create(&manifest_file)
            .map_err(io_err("write the copy manifest", &manifest_file))?;
        let report = copy::copy_project(&root, &partial, Some(&mut manifest))?;
        manifest
            .finish()
            .map_err(io_err("write the copy manifest", &manifest_file))?;
        std::fs::rename(&partial, &copy).map_err(io_err("finish the workspace copy", &copy))?;
        Ok::<_, RuntimeError>(report)
    });
    let report = task
        .await
        .map_err(|e| RuntimeError::spawn("copy the project into the sandbox", e))??;
    let record = serde_json::json!({
        "copiedFiles": report.files,
        "copiedBytes": report.bytes,
        "leftOut": report.left_out,
    });
    write_private(&backend.copy_report_file(), record.to_string().as_bytes())
}
