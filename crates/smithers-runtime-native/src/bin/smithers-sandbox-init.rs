//! The in-sandbox init of the native runtime. Started by the runtime, never by hand.

fn main() {
    smithers_runtime_native::init::main()
}
