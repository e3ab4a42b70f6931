//! Property tests: the README parser, the bounds checker and the JS printer never panic, and
//! what we write we read back.

use proptest::prelude::*;
use serde_json::{Map, Number, Value};
use smithers_bundle::{
    check_output_bounds, js_json, parse_manifest, validate_bundle, write_bundle_with, BundleStatus,
    WriteOptions, WriteParams,
};

/// Arbitrary JSON values, nested up to ~20 levels (past the depth limit of 16), with keys
/// that look like array indexes too.
fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        8 => Just(Value::Null),
        8 => any::<bool>().prop_map(Value::Bool),
        8 => any::<i64>().prop_map(Value::from),
        8 => any::<u64>().prop_map(Value::from),
        8 => any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        8 => ".{0,20}".prop_map(Value::String),
        // Strings at and one past the UTF-16 limit (astral characters count 2), rarely:
        // they are 128 KiB each.
        1 => prop_oneof![Just(65_536usize), Just(65_537)]
            .prop_map(|n| Value::String("😀".repeat(n / 2) + &"a".repeat(n % 2))),
    ];
    leaf.prop_recursive(20, 256, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec((prop_oneof!["[0-9]{1,3}", ".{0,6}"], inner), 0..8)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn parse_manifest_never_panics_on_bytes(raw in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_manifest(&raw);
    }

    #[test]
    fn parse_manifest_never_panics_on_json_like_text(
        s in r#"[ \t\n{}\[\]",:0-9a-z\\.eE+\-]{0,200}"#,
        status in prop_oneof![Just("finished"), Just("failed"), Just("cancelled"), Just("x")],
    ) {
        let _ = parse_manifest(s.as_bytes());
        let wrapped = format!(r#"{{"status": "{status}", "outputs": {s}, "patches": [{s}]}}"#);
        let _ = parse_manifest(wrapped.as_bytes());
    }

    #[test]
    fn manifests_of_any_outputs_round_trip(v in arb_json()) {
        let text = js_json::to_string_pretty(&serde_json::json!({"outputs": v, "status": "failed"}));
        let m = parse_manifest(text.as_bytes()).unwrap();
        prop_assert_eq!(m.status, BundleStatus::Failed);
        // Printing again gives the same bytes (numbers and key order are already canonical).
        prop_assert_eq!(js_json::to_string(m.outputs.as_ref().unwrap()), js_json::to_string(&serde_json::from_str::<Value>(&js_json::to_string(&v)).unwrap()));
    }

    #[test]
    fn bounds_checker_never_panics_and_is_deterministic(v in arb_json()) {
        let a = check_output_bounds("output", &v).map_err(|e| e.to_string());
        let b = check_output_bounds("output", &v).map_err(|e| e.to_string());
        prop_assert_eq!(a, b);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever passes the bounds is written and read back as the same JSON (JS printing).
    #[test]
    fn written_outputs_validate_back(v in arb_json()) {
        prop_assume!(check_output_bounds("output", &v).is_ok());
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("b");
        let mut params = WriteParams::new(&dir, BundleStatus::Finished);
        params.output = Some(v.clone());
        let written = write_bundle_with(&params, &WriteOptions { durable: false });
        match written {
            Ok(_) => {
                let b = validate_bundle(&dir).unwrap();
                prop_assert_eq!(js_json::to_string(b.manifest.outputs.as_ref().unwrap()), js_json::to_string(&v));
            }
            // Only the README size limit may refuse an in-bounds value.
            Err(e) => prop_assert!(e.to_string().contains("README.md exceeds"), "{}", e),
        }
    }
}
