//! Secret redaction of a sandbox config before it is stored.
//!
//! `config_json` is read by anyone who can read the database (the CLI, the web page, the
//! JavaScript package), so it must never carry a secret. The only way to hand a config to the
//! store is a [`RedactedConfig`], whose constructor redacts: callers cannot forget.

use serde_json::{Map, Value};

/// What every redacted value is replaced with (the JavaScript package's marker).
pub const REDACTED: &str = "[redacted]";

/// Egress string settings that may embed credentials (proxy URLs with user:password,
/// certificate material or paths). Redacted like the JavaScript `redactSandboxEgressConfig`;
/// `proxyUrl` and `caCertificate` are the names used by the Rust runtime's `EgressConfig`.
const EGRESS_STRING_KEYS: [&str; 7] = [
    "httpProxy",
    "httpsProxy",
    "noProxy",
    "caCertPem",
    "caCertPath",
    "proxyUrl",
    "caCertificate",
];

/// A sandbox config whose secrets have been removed; the only form the store accepts.
#[derive(Debug, Clone, PartialEq)]
pub struct RedactedConfig {
    value: Value,
    json: String,
}

impl RedactedConfig {
    /// Redacts `config` (see [`redact_config`]) and keeps its JSON text.
    pub fn new(config: &Value) -> Self {
        let value = redact_config(config);
        // Serialising a `Value` cannot fail (all keys are strings, numbers are finite).
        let json = serde_json::to_string(&value).unwrap_or_else(|_| "{}".to_string());
        RedactedConfig { value, json }
    }

    /// The redacted config.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The JSON text stored in `config_json` (and carried by SandboxCreated's `configJson`).
    pub fn as_json(&self) -> &str {
        &self.json
    }
}

/// Returns `config` with every secret replaced:
///
/// - `env`: keys kept (sorted), every value `"[redacted]"`; an `env` that is not an object is
///   replaced whole (the JavaScript package kept it as it was, which could leak).
/// - `egress.env`: like `env`; `egress.httpProxy/httpsProxy/noProxy/caCertPem/caCertPath`:
///   `"[redacted]"`; `egress.secretBindings`: even the NAMES are secret, so only their count
///   survives as `binding_1..n`; any other egress key is dropped (the JavaScript normaliser
///   drops them too). An egress that is not an object (and not null/false) is replaced whole.
///
/// Non-object configs are returned unchanged (there is nothing keyed to redact). Idempotent.
pub fn redact_config(config: &Value) -> Value {
    let Value::Object(source) = config else {
        return config.clone();
    };
    let mut out = source.clone();
    if let Some(env) = source.get("env") {
        out.insert("env".to_string(), redact_env(env));
    }
    if let Some(egress) = source.get("egress") {
        out.insert("egress".to_string(), redact_egress(egress));
    }
    Value::Object(out)
}

fn redact_env(env: &Value) -> Value {
    match env {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), Value::String(REDACTED.to_string())))
                    .collect(),
            )
        }
        Value::Null => Value::Null,
        _ => Value::String(REDACTED.to_string()),
    }
}

fn redact_egress(egress: &Value) -> Value {
    let map = match egress {
        Value::Null | Value::Bool(false) => return egress.clone(),
        Value::Object(map) => map,
        _ => return Value::String(REDACTED.to_string()),
    };
    let mut out = Map::new();
    if let Some(env) = map.get("env") {
        if !is_empty_object(env) {
            out.insert("env".to_string(), redact_env(env));
        }
    }
    for key in EGRESS_STRING_KEYS {
        match map.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s.is_empty() => {}
            Some(Value::Array(a)) if a.is_empty() => {}
            Some(_) => {
                out.insert(key.to_string(), Value::String(REDACTED.to_string()));
            }
        }
    }
    if let Some(bindings) = map.get("secretBindings") {
        let count = match bindings {
            Value::Object(m) => m.len(),
            Value::Null => 0,
            // Not a map: we cannot count names, but we must not keep it either.
            _ => 1,
        };
        if count > 0 {
            out.insert(
                "secretBindings".to_string(),
                Value::Object(
                    (1..=count)
                        .map(|i| (format!("binding_{i}"), Value::String(REDACTED.to_string())))
                        .collect(),
                ),
            );
        }
    }
    Value::Object(out)
}

fn is_empty_object(v: &Value) -> bool {
    matches!(v, Value::Object(m) if m.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn env_values_are_redacted_and_keys_sorted() {
        let c = json!({"image": "alpine", "env": {"ZED": "z-secret", "API_KEY": "sk-123"}});
        let r = RedactedConfig::new(&c);
        assert_eq!(
            r.value(),
            &json!({"image": "alpine", "env": {"API_KEY": "[redacted]", "ZED": "[redacted]"}})
        );
        assert!(!r.as_json().contains("sk-123"));
        assert!(r.as_json().find("API_KEY").unwrap() < r.as_json().find("ZED").unwrap());
    }

    #[test]
    fn egress_secrets_and_binding_names_are_redacted() {
        let c = json!({"egress": {
            "env": {"TOKEN": "t0k"},
            "httpProxy": "http://user:pw@proxy:8080",
            "noProxy": ["a", "b"],
            "caCertPem": "-----BEGIN CERTIFICATE-----",
            "proxyUrl": "http://u2:pw2@p",
            "secretBindings": {"GITHUB_TOKEN": "vault://gh", "NPM": "vault://npm"},
            "unknown": "secret-too"
        }});
        let r = RedactedConfig::new(&c);
        assert_eq!(
            r.value(),
            &json!({"egress": {
                "env": {"TOKEN": "[redacted]"},
                "httpProxy": "[redacted]",
                "noProxy": "[redacted]",
                "caCertPem": "[redacted]",
                "proxyUrl": "[redacted]",
                "secretBindings": {"binding_1": "[redacted]", "binding_2": "[redacted]"}
            }})
        );
        for secret in [
            "t0k",
            "user:pw",
            "GITHUB_TOKEN",
            "vault://",
            "secret-too",
            "BEGIN",
        ] {
            assert!(
                !r.as_json().contains(secret),
                "{secret} leaked: {}",
                r.as_json()
            );
        }
    }

    #[test]
    fn malformed_secret_holders_are_replaced_whole() {
        let r = RedactedConfig::new(&json!({"env": ["A=secret"], "egress": "http://u:p@x"}));
        assert_eq!(
            r.value(),
            &json!({"env": "[redacted]", "egress": "[redacted]"})
        );
    }

    #[test]
    fn redaction_is_idempotent() {
        let c =
            json!({"env": {"A": "1"}, "egress": {"secretBindings": {"X": "y"}, "httpsProxy": "p"}});
        let once = redact_config(&c);
        assert_eq!(redact_config(&once), once);
    }
}
