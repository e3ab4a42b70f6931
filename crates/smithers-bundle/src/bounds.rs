//! The outputs' JSON bounds, with the semantics of the JavaScript package's
//! `assertJsonPayloadWithinBounds` (`@smithers-orchestrator/db/input-bounds`):
//!
//! 1. depth, over the whole tree first: the root is at depth 1, every element or member one
//!    deeper; ANY value (scalars too) deeper than the maximum fails, so 16 nested arrays
//!    around a number fail and 15 pass;
//! 2. then one depth-first pass in JavaScript enumeration order: an array longer than the
//!    maximum fails before its elements are visited; a string VALUE longer than the maximum
//!    (in UTF-16 code units) fails. Object keys are not measured (neither are they in JS).
//!    Non-finite numbers fail in JS; a `serde_json::Value` cannot hold one, so that rule
//!    holds by construction here (a spec with `1e400` is rejected when it is parsed).
//!
//! The first violation found in that order is reported, with the same JS-style path
//! (`output.a[3].b`) as the JavaScript package. Recursion is bounded: pass 1 stops at the
//! maximum depth, and pass 2 only runs on trees that passed it.

use serde_json::Value;

use crate::error::BundleError;
use crate::js_json::{entries, utf16_len, utf16_len_exceeds};
use crate::limits::{
    SANDBOX_BUNDLE_OUTPUT_MAX_ARRAY_LENGTH, SANDBOX_BUNDLE_OUTPUT_MAX_DEPTH,
    SANDBOX_BUNDLE_OUTPUT_MAX_STRING_LENGTH,
};

/// Checks `value` (named `field` in messages, `"output"` for a bundle) against the output
/// bounds of spec §2.
pub fn check_output_bounds(field: &'static str, value: &Value) -> Result<(), BundleError> {
    check_depth(field, value, 1, &mut field.to_string())?;
    check_values(field, value, &mut field.to_string())
}

fn check_depth(
    field: &'static str,
    value: &Value,
    depth: usize,
    path: &mut String,
) -> Result<(), BundleError> {
    if depth > SANDBOX_BUNDLE_OUTPUT_MAX_DEPTH {
        return Err(BundleError::OutputTooDeep {
            field,
            path: path.clone(),
        });
    }
    let len = path.len();
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push_str(&format!("[{i}]"));
                check_depth(field, item, depth + 1, path)?;
                path.truncate(len);
            }
        }
        Value::Object(map) => {
            for (k, v) in entries(map) {
                path.push('.');
                path.push_str(k);
                check_depth(field, v, depth + 1, path)?;
                path.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

fn check_values(field: &'static str, value: &Value, path: &mut String) -> Result<(), BundleError> {
    let len = path.len();
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
        Value::String(s) => {
            if utf16_len_exceeds(s, SANDBOX_BUNDLE_OUTPUT_MAX_STRING_LENGTH) {
                return Err(BundleError::OutputStringTooLong {
                    field,
                    path: path.clone(),
                    actual: utf16_len(s),
                });
            }
        }
        Value::Array(items) => {
            if items.len() > SANDBOX_BUNDLE_OUTPUT_MAX_ARRAY_LENGTH {
                return Err(BundleError::OutputArrayTooLong {
                    field,
                    path: path.clone(),
                    actual: items.len(),
                });
            }
            for (i, item) in items.iter().enumerate() {
                path.push_str(&format!("[{i}]"));
                check_values(field, item, path)?;
                path.truncate(len);
            }
        }
        Value::Object(map) => {
            for (k, v) in entries(map) {
                path.push('.');
                path.push_str(k);
                check_values(field, v, path)?;
                path.truncate(len);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested_arrays(n: usize, inner: Value) -> Value {
        (0..n).fold(inner, |acc, _| Value::Array(vec![acc]))
    }

    #[test]
    fn depth_counts_scalars_and_starts_at_one() {
        assert!(check_output_bounds("output", &nested_arrays(15, json!(1))).is_ok());
        assert!(check_output_bounds("output", &nested_arrays(15, json!([]))).is_ok());
        assert!(check_output_bounds("output", &nested_arrays(16, json!([]))).is_err());
        let err = check_output_bounds("output", &nested_arrays(16, json!(1))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "output exceeds the maximum JSON depth of 16."
        );
        match err {
            BundleError::OutputTooDeep { path, .. } => {
                assert_eq!(path, format!("output{}", "[0]".repeat(16)))
            }
            other => panic!("{other:?}"),
        }
        assert!(check_output_bounds("output", &json!(1)).is_ok());
    }

    #[test]
    fn depth_is_checked_before_strings_and_arrays() {
        let v = json!({"a": "x".repeat(70_000), "b": nested_arrays(16, json!(1))});
        assert!(matches!(
            check_output_bounds("output", &v),
            Err(BundleError::OutputTooDeep { .. })
        ));
    }

    #[test]
    fn strings_count_utf16_units_and_keys_are_not_measured() {
        let ok = "😀".repeat(32_768);
        assert!(check_output_bounds("output", &json!({"k": ok})).is_ok());
        let bad = format!("{ok}a");
        let err = check_output_bounds("output", &json!({"k": bad})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "output contains a string exceeding 65536 characters (at output.k: 65537 characters)."
        );
        let long_key = "k".repeat(70_000);
        assert!(check_output_bounds("output", &json!({ long_key: 1 })).is_ok());
    }

    #[test]
    fn arrays_at_and_past_the_limit() {
        assert!(check_output_bounds("output", &json!(vec![0; 512])).is_ok());
        let err = check_output_bounds("output", &json!({"x": [vec![0; 513]]})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "output contains an array exceeding 512 items."
        );
        match err {
            BundleError::OutputArrayTooLong { path, actual, .. } => {
                assert_eq!(path, "output.x[0]");
                assert_eq!(actual, 513);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn paths_follow_javascript_key_order() {
        let v: Value = serde_json::from_str(r#"{"b": "ok", "1": [1], "a": {"c": [0,0]}}"#).unwrap();
        let long = "y".repeat(65_537);
        let mut v2 = v.clone();
        v2["b"] = json!(long);
        v2["1"] = json!(long);
        match check_output_bounds("output", &v2).unwrap_err() {
            BundleError::OutputStringTooLong { path, .. } => assert_eq!(path, "output.1"),
            other => panic!("{other:?}"),
        }
    }
}
