//! The egress engine's summary as the step's summary tells it (`run`, `show`): the counts
//! and the policy, then each destination denied (or that audit mode would have denied)
//! with why and what would allow it, and one line of every flag that would allow them all.
//!
//! A denial that only says `deny HOST:PORT` sends its reader to the bundle's log and to
//! `egress check`; the reason and the fix are in the summary the engine made, per
//! destination, so they are told here.

use serde_json::Value;

use crate::output::inert;

/// Most destinations told (the engine's summary keeps 100; the counts cover every one).
const MAX_SHOWN: usize = 20;

/// The lines of the egress part of the step's summary; none for a step without a policy.
pub(crate) fn egress_lines(egress: Option<&Value>) -> Vec<String> {
    let Some(e) = egress else {
        return Vec::new();
    };
    let n = |k: &str| e[k].as_u64().unwrap_or(0);
    let mut out = vec![format!(
        "egress   {} allowed, {} denied{} ({} mode, policy {})",
        n("allowed"),
        n("denied"),
        match n("wouldDeny") {
            0 => String::new(),
            w => format!(", {w} would be denied"),
        },
        e["mode"].as_str().unwrap_or("?"),
        e["policy"].as_str().unwrap_or("?"),
    )];
    let denied: Vec<&Value> = e["destinations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["verdict"] != "allow")
        .collect();
    for d in denied.iter().take(MAX_SHOWN) {
        out.extend(denial_lines(d));
    }
    if denied.len() > MAX_SHOWN {
        out.push(format!(
            "  ... and {} more (show --json, or the bundle's log)",
            denied.len() - MAX_SHOWN
        ));
    }
    if let Some(all) = every_flag(&denied) {
        out.push(format!("  to allow them all, run again with {all}"));
    }
    // Hostile text (names, reasons) shown inert.
    out.iter().map(|l| inert(l)).collect()
}

/// One denied destination: what, how often and why, then the rule that would allow it.
fn denial_lines(d: &Value) -> Vec<String> {
    let host = d["host"].as_str().unwrap_or("?");
    let at = match (host, d["port"].as_u64()) {
        ("", _) => "(no destination read)".to_string(),
        (h, Some(0) | None) => format!("{h} (dns)"),
        (h, Some(p)) => format!("{h}:{p}"),
    };
    let why = match d["reason"].as_str() {
        Some(r) => format!(": {r}"),
        None => String::new(),
    };
    let mut out = vec![format!(
        "  {} {at} ({}x){why}",
        d["verdict"].as_str().unwrap_or("?"),
        d["count"]
    )];
    if let Some(fix) = fix_text(&d["fix"], d["port"].as_u64() == Some(0)) {
        out.push(format!("    fix: {fix}"));
    }
    out
}

/// The fix as a person acts on it: the flag and the policy file's rule, or, for the
/// operator's ceiling, the rule it needs. A resolver's denial has no port: its flag names
/// 443, the flag's default, and says so.
fn fix_text(fix: &Value, dns: bool) -> Option<String> {
    let rule = fix.get("rule")?;
    Some(match fix["flag"].as_str() {
        Some(flag) if dns => {
            format!("{flag} (port 443; NAME:PORT for another), or the rule {rule} in a policy file")
        }
        Some(flag) => format!("{flag}, or the rule {rule} in a policy file"),
        None => format!("the host's ceiling (serve --egress-ceiling) must allow it too: {rule}"),
    })
}

/// Every flag that would lift a denial of the step's own policy, once each, when there are
/// two or more: one command line that allows all that was denied. A name denied with a port
/// leaves out its resolver's denial (whose flag only guesses 443).
fn every_flag(denied: &[&Value]) -> Option<String> {
    let flags: Vec<(&str, &str, bool)> = denied
        .iter()
        .filter_map(|d| {
            let flag = d["fix"]["flag"].as_str()?;
            let dns = d["port"].as_u64() == Some(0);
            Some((d["host"].as_str().unwrap_or(""), flag, dns))
        })
        .collect();
    let mut all: Vec<&str> = Vec::new();
    for (host, flag, dns) in &flags {
        let ported = flags.iter().any(|(h, _, d)| h == host && !d);
        if (*dns && ported) || all.contains(flag) {
            continue;
        }
        all.push(flag);
    }
    (all.len() >= 2).then(|| {
        all.iter()
            .take(MAX_SHOWN)
            .copied()
            .collect::<Vec<_>>()
            .join(" ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_denial_says_why_and_what_would_allow_it() {
        let summary = json!({
            "allowed": 3, "denied": 9, "wouldDeny": 0, "mode": "enforce", "policy": "sha256:ab",
            "destinations": [
                {"host": "mirror.corp.example", "port": 443, "verdict": "deny", "count": 6,
                 "reason": "the name resolved to 10.1.2.3, private (10.0.0.0/8), which no cidr rule names on port 443",
                 "fix": {"flag": "--allow-cidr 10.1.2.3/32:443", "rule": {"cidr": "10.1.2.3/32", "ports": [443]}, "scope": "step"}},
                {"host": "x.example", "port": 0, "verdict": "deny", "count": 1,
                 "reason": "no rule allows x.example",
                 "fix": {"flag": "--allow-host x.example", "rule": {"host": "x.example", "ports": [443]}, "scope": "step"}},
                {"host": "x.example", "port": 80, "verdict": "deny", "count": 1,
                 "reason": "no rule allows x.example",
                 "fix": {"flag": "--allow-host x.example:80", "rule": {"host": "x.example", "ports": [80]}, "scope": "step"}},
                {"host": "evil.test", "port": 443, "verdict": "deny", "count": 1,
                 "reason": "the host's ceiling: no rule allows evil.test",
                 "fix": {"rule": {"host": "evil.test", "ports": [443]}, "scope": "ceiling"}},
                {"host": "", "port": 0, "verdict": "deny", "count": 1,
                 "reason": "the proxy could not take the request: malformed request line"},
                {"host": "ok.example", "port": 443, "verdict": "allow", "count": 3},
            ],
        });
        let lines = egress_lines(Some(&summary));
        let text = lines.join("\n");
        assert_eq!(
            lines[0],
            "egress   3 allowed, 9 denied (enforce mode, policy sha256:ab)"
        );
        for want in [
            "  deny mirror.corp.example:443 (6x): the name resolved to 10.1.2.3, private (10.0.0.0/8), which no cidr rule names on port 443",
            "    fix: --allow-cidr 10.1.2.3/32:443, or the rule {\"cidr\":\"10.1.2.3/32\",\"ports\":[443]} in a policy file",
            "  deny x.example (dns) (1x): no rule allows x.example",
            "    fix: --allow-host x.example (port 443; NAME:PORT for another), or the rule {\"host\":\"x.example\",\"ports\":[443]} in a policy file",
            "    fix: the host's ceiling (serve --egress-ceiling) must allow it too: {\"host\":\"evil.test\",\"ports\":[443]}",
            "  deny (no destination read) (1x): the proxy could not take the request: malformed request line",
            "  to allow them all, run again with --allow-cidr 10.1.2.3/32:443 --allow-host x.example:80",
        ] {
            assert!(lines.iter().any(|l| l == want), "no line {want:?} in\n{text}");
        }
        assert!(!text.contains("ok.example"), "{text}");
    }

    #[test]
    fn a_summary_without_reasons_is_still_told() {
        let summary = json!({"allowed": 0, "denied": 1, "mode": "audit", "policy": "sha256:cd", "wouldDeny": 1,
            "destinations": [{"host": "a.example", "port": 443, "verdict": "would-deny", "count": 1}]});
        assert_eq!(
            egress_lines(Some(&summary)),
            vec![
                "egress   0 allowed, 1 denied, 1 would be denied (audit mode, policy sha256:cd)",
                "  would-deny a.example:443 (1x)"
            ]
        );
        assert!(egress_lines(None).is_empty());
        // A hostile name is shown inert.
        let evil = json!({"destinations": [{"host": "a\u{1b}]0;x\u{7}", "port": 1, "verdict": "deny", "count": 1}]});
        assert!(!egress_lines(Some(&evil)).join("").contains('\u{1b}'));
    }
}
