//! The crate graph of ARCHITECTURE.md, enforced. Each rule names a crate and the workspace
//! crates it must never depend on (directly, in any dependency table but dev-dependencies,
//! which tests may use freely).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// (crate, forbidden dependencies, why)
const RULES: &[(&str, &[&str], &str)] = &[
    (
        "smithers-errors",
        &["*"],
        "the vocabulary everyone shares depends on no one",
    ),
    (
        "smithers-terminal",
        &["*"],
        "the escaping of human output is a leaf every renderer can use",
    ),
    (
        "smithers-mcp",
        &["*-except:smithers-terminal"],
        "the MCP protocol and the tools' shapes are shared by the stdio and the HTTP server: what a tool does is theirs",
    ),
    (
        "smithers-paths",
        &["*-except:smithers-errors"],
        "path safety is a leaf",
    ),
    (
        "smithers-bundle",
        &[
            "smithers-runtime",
            "smithers-runtime-*",
            "smithers-store",
            "smithers-orchestrator",
            "smithers-server",
        ],
        "the bundle format knows no runtime and no store",
    ),
    (
        "smithers-patch",
        &[
            "smithers-runtime",
            "smithers-runtime-*",
            "smithers-store",
            "smithers-orchestrator",
            "smithers-server",
        ],
        "patches are computed from directories, whatever produced them",
    ),
    (
        "smithers-runtime",
        &[
            "smithers-runtime-*",
            "smithers-store",
            "smithers-orchestrator",
            "smithers-server",
            "smithers-cli",
        ],
        "the contract depends on no backend",
    ),
    (
        "smithers-runtime-*",
        &[
            "smithers-store",
            "smithers-orchestrator",
            "smithers-server",
            "smithers-cli",
            "smithers-runtime-*",
        ],
        "a backend knows nothing of the lifecycle, the store or other backends",
    ),
    (
        "smithers-store",
        &[
            "smithers-runtime-*",
            "smithers-orchestrator",
            "smithers-server",
            "smithers-cli",
        ],
        "the store knows no runtime",
    ),
    (
        "smithers-orchestrator",
        &["smithers-runtime-*", "smithers-server", "smithers-cli"],
        "the lifecycle sees runtimes only through the trait",
    ),
    (
        "smithers-egress",
        &[
            "smithers-runtime",
            "smithers-runtime-*",
            "smithers-store",
            "smithers-orchestrator",
            "smithers-server",
            "smithers-cli",
        ],
        "the egress engine decides and serves; it knows no runtime that hands it listeners",
    ),
    (
        "smithers-git",
        &[
            "smithers-runtime",
            "smithers-runtime-*",
            "smithers-patch",
            "smithers-store",
            "smithers-orchestrator",
            "smithers-server",
            "smithers-cli",
        ],
        "reading a step's commits and adding them on accept is the bundle format's business, not a runtime's or the lifecycle's",
    ),
    (
        "smithers-wire",
        &[
            "smithers-runtime-*",
            "smithers-store",
            "smithers-orchestrator",
            "smithers-server",
            "smithers-cli",
        ],
        "what a host and its clients exchange is shared by both ends: it knows no backend, store or lifecycle",
    ),
    (
        "smithers-server",
        &["smithers-runtime-*", "smithers-cli"],
        "the host serves whatever Runtime it is given (the CLI injects one): it depends on no backend",
    ),
    (
        "smithers-resident",
        &["*"],
        "the resident service's socket, admission and descriptor passing know nothing of steps: the CLI decides what a served request runs",
    ),
    (
        "smithers-sandbox-init",
        &["*"],
        "the init is a security boundary of its own: it knows nothing of the runtime that starts it",
    ),
];

/// The only crates the init may name as dependencies: no async runtime, nothing of ours.
const INIT_ALLOWED: &[&str] = &[
    "libc",
    "serde",
    "serde_json",
    "landlock",
    "rustix",
    "thiserror",
];

/// What may never be among the init's dependencies, direct or not (its tests included: they
/// stay single-threaded and synchronous too).
const INIT_FORBIDDEN: &[&str] = &[
    "tokio",
    "tokio-*",
    "async-*",
    "futures",
    "futures-*",
    "mio",
    "smithers-*",
];

/// The crate every test may use and no code may: the CI-aware skip and the backends' suites.
const TEST_SUPPORT: &str = "smithers-test-support";

/// What the test-support crate may depend on (in any table): the runtime contract and what
/// lies beneath it, never a backend, the store, the lifecycle, the host or the CLI (the suites
/// drive any runtime through the trait alone).
const TEST_SUPPORT_MAY_USE: &[&str] = &["smithers-runtime", "smithers-errors"];

/// (crate, dependency, why): the only edges allowed that a rule above forbids.
const ALLOWED_EDGES: &[(&str, &str, &str)] = &[(
    "smithers-runtime-ray",
    "smithers-runtime-remote",
    "a fleet lease is a codeplane host on a node: the ray runtime drives it with the remote client instead of a second copy",
)];

fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// Every workspace crate's manifest, by package name.
fn workspace_manifests() -> BTreeMap<String, toml::Table> {
    let crates_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut manifests = BTreeMap::new();
    for entry in std::fs::read_dir(&crates_dir).unwrap() {
        let manifest = entry.unwrap().path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let doc: toml::Table =
            toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
        let name = doc["package"]["name"].as_str().unwrap().to_string();
        manifests.insert(name, doc);
    }
    manifests
}

/// The workspace crates a manifest names in `keys` (`dependencies`, `dev-dependencies`, ...),
/// target-specific tables included.
fn workspace_deps(doc: &toml::Table, keys: &[&str]) -> BTreeSet<String> {
    let mut tables: Vec<&toml::Table> = Vec::new();
    for key in keys {
        if let Some(t) = doc.get(*key).and_then(|v| v.as_table()) {
            tables.push(t);
        }
    }
    if let Some(targets) = doc.get("target").and_then(|v| v.as_table()) {
        for target in targets.values() {
            for key in keys {
                if let Some(t) = target.get(*key).and_then(|v| v.as_table()) {
                    tables.push(t);
                }
            }
        }
    }
    let mut deps = BTreeSet::new();
    for table in tables {
        for (dep, spec) in table {
            let real = spec.get("package").and_then(|p| p.as_str()).unwrap_or(dep);
            if real.starts_with("smithers-") {
                deps.insert(real.to_string());
            }
        }
    }
    deps
}

fn workspace_crates() -> BTreeMap<String, BTreeSet<String>> {
    // Normal and build dependencies, including target-specific ones; not dev-dependencies.
    workspace_manifests()
        .into_iter()
        .map(|(name, doc)| {
            let deps = workspace_deps(&doc, &["dependencies", "build-dependencies"]);
            (name, deps)
        })
        .collect()
}

#[test]
fn no_forbidden_edges() {
    let graph = workspace_crates();
    assert!(
        graph.contains_key("smithers-errors"),
        "workspace not found: {graph:?}"
    );
    let mut violations = Vec::new();
    for (krate, deps) in &graph {
        for (pattern, forbidden, why) in RULES {
            if !matches(pattern, krate) {
                continue;
            }
            for dep in deps {
                if ALLOWED_EDGES
                    .iter()
                    .any(|(from, to, _)| from == krate && to == dep)
                {
                    continue;
                }
                let bad = forbidden.iter().any(|f| {
                    if let Some(allowed) = f.strip_prefix("*-except:") {
                        dep != allowed
                    } else if *f == "*" {
                        true
                    } else {
                        matches(f, dep) && dep != krate
                    }
                });
                if bad {
                    violations.push(format!("{krate} -> {dep}: forbidden ({why})"));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "forbidden dependency edges:\n{}",
        violations.join("\n")
    );
}

/// The test-support crate is only ever a dev-dependency (no crate's code may use a test
/// double, a skip or a suite), and depends only on the runtime contract and what is beneath it.
#[test]
fn test_support_is_only_a_dev_dependency() {
    let manifests = workspace_manifests();
    let support = manifests
        .get(TEST_SUPPORT)
        .unwrap_or_else(|| panic!("{TEST_SUPPORT} not found among {:?}", manifests.keys()));
    assert_eq!(
        support["package"].get("publish").and_then(|p| p.as_bool()),
        Some(false),
        "{TEST_SUPPORT} must say publish = false"
    );
    let mut violations = Vec::new();
    let own = workspace_deps(
        support,
        &["dependencies", "build-dependencies", "dev-dependencies"],
    );
    for dep in own
        .iter()
        .filter(|d| !TEST_SUPPORT_MAY_USE.contains(&d.as_str()))
    {
        violations.push(format!(
            "{TEST_SUPPORT} -> {dep}: forbidden (the test support may use only {TEST_SUPPORT_MAY_USE:?})"
        ));
    }
    let mut dev_users = 0;
    for (krate, doc) in &manifests {
        if workspace_deps(doc, &["dependencies", "build-dependencies"]).contains(TEST_SUPPORT) {
            violations.push(format!(
                "{krate} -> {TEST_SUPPORT}: forbidden (only ever a dev-dependency)"
            ));
        }
        if workspace_deps(doc, &["dev-dependencies"]).contains(TEST_SUPPORT) {
            dev_users += 1;
        }
    }
    assert!(
        dev_users > 0,
        "no crate's tests use {TEST_SUPPORT}: manifests not read?"
    );
    assert!(
        violations.is_empty(),
        "forbidden dependency edges:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_rules_do_bite() {
    // A rule that matches nothing would make the check above hollow.
    assert!(matches("smithers-runtime-*", "smithers-runtime-native"));
    assert!(!matches("smithers-runtime-*", "smithers-runtime"));
    assert!(matches("smithers-store", "smithers-store"));
    // The init's list catches what it is meant to.
    assert!(INIT_FORBIDDEN.iter().any(|f| matches(f, "tokio")));
    assert!(INIT_FORBIDDEN.iter().any(|f| matches(f, "tokio-util")));
    assert!(INIT_FORBIDDEN
        .iter()
        .any(|f| matches(f, "smithers-runtime-native")));
    assert!(!INIT_FORBIDDEN.iter().any(|f| matches(f, "libc")));
}

fn manifest(krate: &str) -> toml::Table {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("Cargo.toml");
    toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[test]
fn the_init_names_only_its_allowed_dependencies() {
    let doc = manifest("smithers-sandbox-init");
    let mut named = Vec::new();
    for key in ["dependencies", "build-dependencies", "dev-dependencies"] {
        if let Some(t) = doc.get(key).and_then(|v| v.as_table()) {
            named.extend(t.keys().cloned());
        }
    }
    assert!(
        doc.get("target").is_none(),
        "no target-specific dependencies"
    );
    let extra: Vec<_> = named
        .iter()
        .filter(|d| !INIT_ALLOWED.contains(&d.as_str()))
        .collect();
    assert!(
        named.iter().any(|d| d == "libc"),
        "manifest not read: {named:?}"
    );
    assert!(
        extra.is_empty(),
        "smithers-sandbox-init depends on {extra:?}"
    );
}

/// Every package the init depends on, directly or not, from the workspace's Cargo.lock.
fn init_closure() -> BTreeSet<String> {
    let lock = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.lock");
    let lock: toml::Table = toml::from_str(&std::fs::read_to_string(lock).unwrap()).unwrap();
    let packages = lock["package"].as_array().unwrap();
    let deps_of = |name: &str, version: Option<&str>| -> Vec<String> {
        packages
            .iter()
            .filter(|p| p["name"].as_str() == Some(name))
            .filter(|p| version.is_none_or(|v| p["version"].as_str() == Some(v)))
            .flat_map(|p| p.get("dependencies").and_then(|d| d.as_array()).cloned())
            .flatten()
            .filter_map(|d| d.as_str().map(str::to_string))
            .collect()
    };
    let mut seen = BTreeSet::new();
    let mut todo = vec!["smithers-sandbox-init".to_string()];
    while let Some(dep) = todo.pop() {
        if !seen.insert(dep.clone()) {
            continue;
        }
        let mut parts = dep.split(' ');
        let name = parts.next().unwrap();
        todo.extend(deps_of(name, parts.next()));
    }
    seen.into_iter()
        .map(|d| d.split(' ').next().unwrap().to_string())
        .collect()
}

#[test]
fn nothing_async_reaches_the_init() {
    let closure = init_closure();
    assert!(closure.contains("libc"), "lock not read: {closure:?}");
    let bad: Vec<_> = closure
        .iter()
        .filter(|d| *d != "smithers-sandbox-init")
        .filter(|d| INIT_FORBIDDEN.iter().any(|f| matches(f, d)))
        .collect();
    assert!(bad.is_empty(), "smithers-sandbox-init reaches {bad:?}");
}
