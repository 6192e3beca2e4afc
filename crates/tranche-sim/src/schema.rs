//! A small, valid JSON instance for a JSON Schema: what the fake model answers under structured
//! output (`response_format.type == "json_schema"`).
//!
//! Handles the subset structured outputs use: `type` (single or list), object/properties/required,
//! string (with `format`, `minLength`, `maxLength`), number/integer (with bounds), boolean, null,
//! array (`items`, `prefixItems`, `minItems`, `maxItems`), `enum`, `const`, `anyOf`/`oneOf`/`allOf`
//! and local `$ref`s (`#`, `#/$defs/..`, `#/definitions/..`). Choices among enum values are taken
//! from a hash, so different requests get different but reproducible answers.

use std::cell::Cell;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

const MAX_DEPTH: usize = 24;
/// Most values generated for one schema, so recursive schemas with wide arrays stay small.
const MAX_NODES: usize = 10_000;

/// A JSON value valid against `schema`, chosen deterministically from `salt`.
pub(crate) fn instance(schema: &Value, salt: &str) -> Value {
    let generator = Generator { root: schema, salt, budget: Cell::new(MAX_NODES) };
    generator.value(schema, "$", 0)
}

/// A JSON value that is *not* valid against `schema` (the answer of a schema-violation fault): the
/// valid instance without its first required property, or, without required properties, a value
/// of the wrong type.
pub(crate) fn violation(schema: &Value, salt: &str) -> Value {
    let mut root = schema;
    for _ in 0..MAX_DEPTH {
        match root.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#')) {
            Some("") => break,
            Some(pointer) => match schema.pointer(pointer) {
                Some(target) => root = target,
                None => break,
            },
            None => break,
        }
    }
    match instance(schema, salt) {
        Value::Object(mut fields) => {
            let first_required = root
                .get("required")
                .and_then(Value::as_array)
                .and_then(|r| r.iter().filter_map(Value::as_str).next());
            match first_required {
                Some(name) => {
                    fields.remove(name);
                    fields.insert("sim_unexpected_field".to_owned(), Value::Bool(true));
                    Value::Object(fields)
                }
                // An array where an object is expected.
                None => Value::Array(vec![Value::Object(fields)]),
            }
        }
        // An object where something else is expected.
        _ => json!({"sim_unexpected_field": true}),
    }
}

struct Generator<'a> {
    root: &'a Value,
    salt: &'a str,
    budget: Cell<usize>,
}

impl Generator<'_> {
    fn pick(&self, path: &str, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let digest = Sha256::new()
            .chain_update(self.salt.as_bytes())
            .chain_update([0])
            .chain_update(path.as_bytes())
            .finalize();
        let mut word = [0u8; 8];
        word.copy_from_slice(&digest[..8]);
        // The modulus is below n, so the value fits a usize.
        (u64::from_le_bytes(word) % n as u64) as usize
    }

    fn tag(&self, path: &str) -> String {
        let digest = Sha256::new()
            .chain_update(self.salt.as_bytes())
            .chain_update([1])
            .chain_update(path.as_bytes())
            .finalize();
        hex::encode(&digest[..3])
    }

    fn resolve<'s>(&'s self, reference: &str) -> Option<&'s Value> {
        let pointer = reference.strip_prefix('#')?;
        if pointer.is_empty() {
            return Some(self.root);
        }
        self.root.pointer(pointer)
    }

    fn value(&self, schema: &Value, path: &str, depth: usize) -> Value {
        let left = self.budget.get();
        if depth > MAX_DEPTH || left == 0 {
            return Value::Null;
        }
        self.budget.set(left - 1);
        let Some(obj) = schema.as_object() else {
            // `true` or `{}` accept anything; `false` accepts nothing, so any answer is as good.
            return Value::Null;
        };
        if let Some(reference) = obj.get("$ref").and_then(Value::as_str) {
            return match self.resolve(reference) {
                Some(target) => self.value(target, path, depth + 1),
                None => Value::Null,
            };
        }
        if let Some(c) = obj.get("const") {
            return c.clone();
        }
        if let Some(values) = obj.get("enum").and_then(Value::as_array) {
            return values.get(self.pick(path, values.len())).cloned().unwrap_or(Value::Null);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(options) = obj.get(key).and_then(Value::as_array) {
                let chosen = options
                    .iter()
                    .find(|o| o.get("type").and_then(Value::as_str) != Some("null"))
                    .or_else(|| options.first());
                if let Some(chosen) = chosen {
                    return self.value(chosen, path, depth + 1);
                }
            }
        }
        if let Some(parts) = obj.get("allOf").and_then(Value::as_array) {
            return self.all_of(parts, path, depth);
        }
        match schema_type(obj) {
            Some("object") => self.object(obj, path, depth),
            Some("array") => self.array(obj, path, depth),
            Some("string") => self.string(obj, path),
            Some("integer") => integer(obj),
            Some("number") => number(obj),
            Some("boolean") => Value::Bool(true),
            _ => Value::Null,
        }
    }

    fn all_of(&self, parts: &[Value], path: &str, depth: usize) -> Value {
        // Objects merge; for anything else the first part decides.
        let mut merged = Map::new();
        let mut any_object = false;
        for part in parts {
            match self.value(part, path, depth + 1) {
                Value::Object(fields) => {
                    any_object = true;
                    merged.extend(fields);
                }
                other if !any_object => return other,
                _ => {}
            }
        }
        Value::Object(merged)
    }

    fn object(&self, obj: &Map<String, Value>, path: &str, depth: usize) -> Value {
        let mut out = Map::new();
        if let Some(props) = obj.get("properties").and_then(Value::as_object) {
            for (name, sub) in props {
                let sub_path = format!("{path}.{name}");
                out.insert(name.clone(), self.value(sub, &sub_path, depth + 1));
            }
        }
        // A required name without a property schema still has to be present.
        if let Some(required) = obj.get("required").and_then(Value::as_array) {
            for name in required.iter().filter_map(Value::as_str) {
                out.entry(name.to_owned()).or_insert(Value::Null);
            }
        }
        Value::Object(out)
    }

    fn array(&self, obj: &Map<String, Value>, path: &str, depth: usize) -> Value {
        let min = obj.get("minItems").and_then(Value::as_u64).unwrap_or(1);
        let max = obj.get("maxItems").and_then(Value::as_u64).unwrap_or(u64::MAX);
        let n = min.max(1).min(max).min(16);
        let prefix = obj.get("prefixItems").and_then(Value::as_array);
        let items = obj.get("items");
        let mut out = Vec::new();
        for i in 0..n {
            let idx = usize::try_from(i).unwrap_or(usize::MAX);
            let sub = prefix.and_then(|p| p.get(idx)).or(items).unwrap_or(&Value::Null);
            out.push(self.value(sub, &format!("{path}[{i}]"), depth + 1));
        }
        Value::Array(out)
    }

    fn string(&self, obj: &Map<String, Value>, path: &str) -> Value {
        let mut s = match obj.get("format").and_then(Value::as_str) {
            Some("date") => "2024-01-01".to_owned(),
            Some("date-time") => "2024-01-01T00:00:00Z".to_owned(),
            Some("time") => "00:00:00Z".to_owned(),
            Some("email") => "sim@example.com".to_owned(),
            Some("uri") => "https://example.com/sim".to_owned(),
            Some("uuid") => "00000000-0000-4000-8000-000000000000".to_owned(),
            Some("hostname") => "example.com".to_owned(),
            Some("ipv4") => "192.0.2.1".to_owned(),
            _ => format!("sim-{}", self.tag(path)),
        };
        let min = obj
            .get("minLength")
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
        let max = obj
            .get("maxLength")
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(usize::MAX);
        while s.chars().count() < min {
            s.push('x');
        }
        if s.chars().count() > max {
            s = s.chars().take(max).collect();
        }
        Value::String(s)
    }
}

fn schema_type(obj: &Map<String, Value>) -> Option<&str> {
    match obj.get("type") {
        Some(Value::String(t)) => Some(t.as_str()),
        Some(Value::Array(types)) => {
            types.iter().filter_map(Value::as_str).find(|t| *t != "null").or(Some("null"))
        }
        _ if obj.contains_key("properties") => Some("object"),
        _ if obj.contains_key("items") || obj.contains_key("prefixItems") => Some("array"),
        _ => None,
    }
}

fn bounds(obj: &Map<String, Value>, step: f64) -> (f64, f64) {
    let get = |k: &str| obj.get(k).and_then(Value::as_f64);
    let lo = match (get("minimum"), get("exclusiveMinimum")) {
        (Some(m), Some(e)) => m.max(e + step),
        (Some(m), None) => m,
        (None, Some(e)) => e + step,
        (None, None) => f64::NEG_INFINITY,
    };
    let hi = match (get("maximum"), get("exclusiveMaximum")) {
        (Some(m), Some(e)) => m.min(e - step),
        (Some(m), None) => m,
        (None, Some(e)) => e - step,
        (None, None) => f64::INFINITY,
    };
    (lo, hi)
}

fn integer(obj: &Map<String, Value>) -> Value {
    let (lo, hi) = bounds(obj, 1.0);
    let v = 1.0_f64.max(lo.ceil()).min(hi.floor());
    // Bounds come from JSON numbers; `as` saturates if they are absurd.
    json!(v as i64)
}

fn number(obj: &Map<String, Value>) -> Value {
    let (lo, hi) = bounds(obj, 0.001);
    let v = 0.5_f64.max(lo).min(hi);
    json!(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_with_everything() {
        let schema = json!({
            "type": "object",
            "properties": {
                "label": {"type": "string", "enum": ["billing", "bug", "other"]},
                "score": {"type": "number", "minimum": 2, "maximum": 3},
                "count": {"type": "integer", "exclusiveMinimum": 4},
                "ok": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "minItems": 2},
                "when": {"type": ["string", "null"], "format": "date"},
                "nested": {"$ref": "#/$defs/inner"},
                "choice": {"anyOf": [{"type": "null"}, {"type": "integer", "maximum": -3}]}
            },
            "required": ["label", "score", "count", "ok", "tags", "when", "nested", "choice", "extra"],
            "additionalProperties": false,
            "$defs": {"inner": {"type": "object", "properties": {"k": {"const": 5}}, "required": ["k"]}}
        });
        let v = instance(&schema, "salt");
        assert!(["billing", "bug", "other"].contains(&v["label"].as_str().unwrap()));
        let score = v["score"].as_f64().unwrap();
        assert!((2.0..=3.0).contains(&score));
        assert_eq!(v["count"], 5);
        assert_eq!(v["ok"], true);
        assert_eq!(v["tags"].as_array().unwrap().len(), 2);
        assert!(v["tags"][0].as_str().unwrap().len() <= 4);
        assert_eq!(v["when"], "2024-01-01");
        assert_eq!(v["nested"], json!({"k": 5}));
        assert_eq!(v["choice"], -3);
        assert!(v.as_object().unwrap().contains_key("extra"));
    }

    #[test]
    fn violations_break_the_schema() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["b", "a"]});
        let v = violation(&schema, "s");
        assert!(v.get("b").is_none());
        assert_eq!(v["a"], instance(&schema, "s")["a"]);
        let loose = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        assert!(violation(&loose, "s").is_array());
        assert!(violation(&json!({"type": "string"}), "s").is_object());
        let by_ref = json!({"$ref": "#/$defs/x", "$defs": {"x": {"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]}}});
        assert!(violation(&by_ref, "s").get("k").is_none());
    }

    #[test]
    fn deterministic_and_salt_dependent() {
        let schema = json!({"type": "string"});
        assert_eq!(instance(&schema, "a"), instance(&schema, "a"));
        assert_ne!(instance(&schema, "a"), instance(&schema, "b"));
    }

    #[test]
    fn recursive_refs_terminate() {
        let schema = json!({"type": "object", "properties": {"next": {"$ref": "#"}}});
        let v = instance(&schema, "x");
        assert!(v.is_object());
    }

    #[test]
    fn min_length_and_empty_arrays() {
        let v = instance(&json!({"type": "string", "minLength": 40}), "s");
        assert!(v.as_str().unwrap().len() >= 40);
        let v = instance(&json!({"type": "array", "maxItems": 0}), "s");
        assert_eq!(v, json!([]));
    }
}
