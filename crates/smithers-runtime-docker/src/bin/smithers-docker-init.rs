//! This build's in-sandbox init as a program of its own, started as `smithers-sandbox
//! __sandbox-init ARGS` is (`smithers-docker-init __sandbox-init ARGS`): the binary the docker
//! runtime binds into its containers (`DockerOptions::egress_holder`) where the CLI's own is
//! not at hand, as in this crate's tests. Never started by hand.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = match args.first().map(String::as_str) {
        Some("__sandbox-init") => &args[1..],
        _ => &args[..],
    };
    std::process::exit(smithers_sandbox_init::run(args))
}
