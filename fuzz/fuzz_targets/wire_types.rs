//! The sandbox host API's JSON documents, read by the server from clients (a create request,
//! its controls checked as `serve` checks them) and by the client from a server (sandbox
//! info, execute answers, events, and the SSE stream that carries them).
#![no_main]
use libfuzzer_sys::fuzz_target;
use smithers_runtime_remote::wire::{
    CreateSandbox, ExecuteAccepted, SandboxInfo, SeqEvent, Shipped, WireEvent, WorkspaceUploaded,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(create) = serde_json::from_slice::<CreateSandbox>(data) {
        let _ = create.controls.validate();
        // What was accepted serialises and reads back the same.
        let again = serde_json::to_vec(&create).expect("serialise");
        let back: CreateSandbox = serde_json::from_slice(&again).expect("read back");
        assert_eq!(back, create);
    }
    let _ = serde_json::from_slice::<SandboxInfo>(data);
    let _ = serde_json::from_slice::<ExecuteAccepted>(data);
    let _ = serde_json::from_slice::<WorkspaceUploaded>(data);
    let _ = serde_json::from_slice::<Shipped>(data);
    let _ = serde_json::from_slice::<WireEvent>(data);
    // The event stream, cut at odd places as a network would.
    let mut sse = smithers_runtime_remote::SseParser::new();
    for chunk in data.chunks(7) {
        for frame in sse.push(chunk) {
            let _ = serde_json::from_str::<SeqEvent>(&frame.data);
        }
    }
});
