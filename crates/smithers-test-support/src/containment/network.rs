//! Rows 1-2: the network (the host's loopback, any route outside).

use serde_json::Value;

use super::{args, batch, words};
use crate::conformance::{
    assert_reported_not_enforced, breaches, run_once, CaseResult, Project, SuiteEnv,
};

/// Row 1: a TCP server on the host's 127.0.0.1 is unreachable.
pub async fn row01_host_loopback_unreachable(env: &SuiteEnv) -> CaseResult {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind host listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port().to_string();
    let project = Project::new(env);
    let (exec, _) = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&[
            "connect-tcp",
            "127.0.0.1",
            &port,
            "+",
            "connect-tcp",
            "[::1]",
            &port,
        ]),
    )
    .await?;
    let results = exec.attempts("connect-tcp");
    assert_eq!(results.len(), 2, "{}", exec.output.dump());
    assert!(
        listener.accept().is_err(),
        "row 1: the host listener accepted a connection from inside the sandbox"
    );
    assert_reported_not_enforced(
        env,
        "row 1",
        &["network"],
        Some(&exec.outcome),
        &breaches(&results),
    )
    .await;
    Ok(())
}

/// Row 2: no way out: only loopback, no routes, no route to TEST-NET addresses (v4 and v6),
/// and the resolver's nameservers unreachable. Nothing is sent: UDP connect is a route lookup.
pub async fn row02_no_route_outside(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let mut attempts = vec![
        words("net-info"),
        // Runs only when the sandbox has no route (the tool checks), so no query can leave.
        words("resolve example.com"),
        words("udp-route 192.0.2.1 53"),
        words("udp-route 198.51.100.7 443"),
        words("udp-route [2001:db8::1] 53"),
    ];
    // The host's nameservers, as the sandbox would try to reach them to resolve a name.
    let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    for ns in resolv
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .map(str::trim)
        .filter(|ns| {
            ns.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| !ip.is_loopback())
        })
        .take(3)
    {
        let target = if ns.contains(':') {
            format!("[{ns}]")
        } else {
            ns.to_string()
        };
        attempts.push(vec!["udp-route".into(), target, "53".into()]);
    }
    let argv = batch(&attempts);
    let (exec, _) = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&args(&argv)),
    )
    .await?;
    let results = exec.output.attempts();
    assert_eq!(results.len(), attempts.len(), "{}", exec.output.dump());
    let info = exec.attempt("net-info");
    assert_reported_not_enforced(
        env,
        "row 2",
        &["network"],
        Some(&exec.outcome),
        &breaches(&results),
    )
    .await;
    if info["ok"] == false {
        let ifs: Vec<&str> = info["interfaces"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert!(ifs.iter().all(|i| *i == "lo"), "{info}");
    }
    Ok(())
}
