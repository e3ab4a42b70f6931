//! Model-based property test of the tri-state upsert: any sequence of upserts leaves the row
//! exactly as a plain in-memory model says (absent leaves, null clears, value sets; NOT NULL
//! columns keep their defaults on insert).

use proptest::prelude::*;
use serde_json::json;
use smithers_store::{Field, RedactedConfig, SandboxStatus, SandboxUpsert, Store};

#[derive(Debug, Clone, Default, PartialEq)]
struct Model {
    runtime: String,
    remote_run_id: Option<String>,
    container_id: Option<String>,
    config_json: String,
    status: String,
    shipped_at_ms: Option<i64>,
    bundle_path: Option<String>,
}

fn field<T: Clone + std::fmt::Debug>(
    v: impl Strategy<Value = T>,
) -> impl Strategy<Value = Field<T>> {
    prop_oneof![
        Just(Field::Absent),
        Just(Field::Null),
        v.prop_map(Field::Value)
    ]
}

fn apply<T: Clone>(model: &mut Option<T>, f: &Field<T>) {
    match f {
        Field::Absent => {}
        Field::Null => *model = None,
        Field::Value(v) => *model = Some(v.clone()),
    }
}

#[derive(Debug, Clone)]
struct Op {
    runtime: Option<String>,
    remote_run_id: Field<String>,
    container_id: Field<String>,
    config: Option<u8>,
    status: Option<&'static str>,
    shipped_at_ms: Field<i64>,
    bundle_path: Field<String>,
}

fn op() -> impl Strategy<Value = Op> {
    (
        proptest::option::of(prop_oneof![
            Just("docker".to_string()),
            Just("codeplane".to_string())
        ]),
        field("[a-z]{1,4}"),
        field("[a-z]{1,4}"),
        proptest::option::of(0u8..4),
        proptest::option::of(prop_oneof![
            Just("pending"),
            Just("shipped"),
            Just("finished")
        ]),
        field(0i64..1000),
        field("/[a-z]{1,6}"),
    )
        .prop_map(
            |(runtime, remote_run_id, container_id, config, status, shipped_at_ms, bundle_path)| {
                Op {
                    runtime,
                    remote_run_id,
                    container_id,
                    config,
                    status,
                    shipped_at_ms,
                    bundle_path,
                }
            },
        )
}

fn config(n: u8) -> RedactedConfig {
    RedactedConfig::new(&json!({"n": n, "env": {"K": format!("secret-{n}")}}))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn upserts_match_the_model(ops in proptest::collection::vec(op(), 1..12)) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("m.db")).unwrap();
        let mut model: Option<Model> = None;
        for o in &ops {
            let up = SandboxUpsert {
                runtime: o.runtime.clone(),
                remote_run_id: o.remote_run_id.clone(),
                container_id: o.container_id.clone(),
                config: o.config.map(config),
                status: o.status.map(SandboxStatus::parse),
                shipped_at_ms: o.shipped_at_ms.clone(),
                bundle_path: o.bundle_path.clone(),
                ..SandboxUpsert::key("r", "s")
            };
            let result = store.upsert_sandbox(&up);
            match model.as_mut() {
                None => {
                    // Insert: config_json is NOT NULL without a default.
                    let Some(n) = o.config else {
                        prop_assert!(result.is_err());
                        prop_assert!(store.get_sandbox("r", "s").unwrap().is_none());
                        continue;
                    };
                    result.unwrap();
                    let mut m = Model {
                        runtime: o.runtime.clone().unwrap_or_else(|| "bubblewrap".into()),
                        config_json: config(n).as_json().to_string(),
                        status: o.status.unwrap_or("pending").to_string(),
                        ..Model::default()
                    };
                    apply(&mut m.remote_run_id, &o.remote_run_id);
                    apply(&mut m.container_id, &o.container_id);
                    apply(&mut m.shipped_at_ms, &o.shipped_at_ms);
                    apply(&mut m.bundle_path, &o.bundle_path);
                    model = Some(m);
                }
                Some(m) => {
                    result.unwrap();
                    if let Some(r) = &o.runtime { m.runtime = r.clone(); }
                    if let Some(n) = o.config { m.config_json = config(n).as_json().to_string(); }
                    if let Some(s) = o.status { m.status = s.to_string(); }
                    apply(&mut m.remote_run_id, &o.remote_run_id);
                    apply(&mut m.container_id, &o.container_id);
                    apply(&mut m.shipped_at_ms, &o.shipped_at_ms);
                    apply(&mut m.bundle_path, &o.bundle_path);
                }
            }
            let row = store.get_sandbox("r", "s").unwrap().unwrap();
            let m = model.as_ref().unwrap();
            prop_assert_eq!(&row.runtime, &m.runtime);
            prop_assert_eq!(&row.remote_run_id, &m.remote_run_id);
            prop_assert_eq!(&row.container_id, &m.container_id);
            prop_assert_eq!(&row.config_json, &m.config_json);
            prop_assert_eq!(row.status.as_str(), m.status.as_str());
            prop_assert_eq!(row.shipped_at_ms, m.shipped_at_ms);
            prop_assert_eq!(&row.bundle_path, &m.bundle_path);
            prop_assert!(!row.config_json.contains("secret-"));
            // Untouched columns stay NULL.
            prop_assert_eq!(row.workspace_id, None);
        }
    }
}
