//! The in-sandbox init of the native runtime (the `smithers-sandbox-init` crate). Started by
//! the runtime, never by hand. Built here so that the runtime's tests (and its lookup next to
//! the current executable) find it with the runtime.

fn main() {
    smithers_sandbox_init::main()
}
