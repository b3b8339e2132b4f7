//! Flattening of a YAML configuration document into dotted `key -> value` strings.
//!
//! Flink 2's `config.yaml` allows both `parallelism.default: 4` and nested maps such as
//! `execution: { checkpointing: { interval: 10s } }`; both become the same dotted keys here.

use std::collections::HashSet;
use std::path::Path;

use serde_norway::{Mapping, Value};

use crate::error::{ConfigError, one_line};

/// Parses YAML text and returns its flattened entries in document order.
///
/// Scalars become their string form, lists become their items joined with `;`, nulls are
/// left out, and an empty document yields no entries. `path` is only used in errors.
pub(crate) fn flatten_yaml(text: &str, path: &Path) -> Result<Vec<(String, String)>, ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidFile { path: path.to_path_buf(), reason };
    let document: Value = match serde_norway::from_str(text) {
        Ok(document) => document,
        Err(error) => return Err(invalid(one_line(&error.to_string()))),
    };
    let mapping = match document {
        Value::Null => return Ok(Vec::new()),
        Value::Mapping(mapping) => mapping,
        other => {
            return Err(invalid(format!(
                "expected a map of configuration keys at the top level, found {}",
                kind_of(&other)
            )));
        }
    };

    let mut entries = Vec::new();
    flatten_mapping("", &mapping, &mut entries).map_err(invalid)?;

    let mut seen = HashSet::new();
    for (key, _) in &entries {
        if !seen.insert(key.as_str()) {
            return Err(invalid(format!("configuration key '{key}' is defined more than once")));
        }
    }
    Ok(entries)
}

/// Appends the entries of `mapping`, with keys prefixed by `prefix` and a dot.
fn flatten_mapping(prefix: &str, mapping: &Mapping, out: &mut Vec<(String, String)>) -> Result<(), String> {
    for (key, value) in mapping {
        let Some(segment) = scalar_text(key) else {
            return Err(format!(
                "keys must be plain text, found {} as a key under '{}'",
                kind_of(key),
                display_prefix(prefix)
            ));
        };
        if segment.is_empty() {
            return Err(format!("empty key under '{}'", display_prefix(prefix)));
        }
        let full_key = if prefix.is_empty() { segment } else { format!("{prefix}.{segment}") };
        match value {
            Value::Null => {}
            Value::Mapping(inner) => flatten_mapping(&full_key, inner, out)?,
            Value::Sequence(items) => {
                let joined = join_list(&full_key, items)?;
                out.push((full_key, joined));
            }
            Value::Tagged(_) => {
                return Err(format!("yaml tags are not supported (configuration key '{full_key}')"));
            }
            scalar => {
                // Bool, Number and String always have a text form.
                let Some(text) = scalar_text(scalar) else {
                    return Err(format!("unsupported value for configuration key '{full_key}'"));
                };
                out.push((full_key, text));
            }
        }
    }
    Ok(())
}

/// Joins list items with `;`, the way Flink 2 turns a YAML list into a list option.
///
/// Null items are skipped; an item that is itself a map becomes Flink's map form
/// `k1:v1,k2:v2`. Lists nested in lists are rejected.
fn join_list(key: &str, items: &[Value]) -> Result<String, String> {
    let mut parts = Vec::new();
    for item in items {
        if item.is_null() {
            continue;
        }
        if let Some(text) = scalar_text(item) {
            parts.push(text);
            continue;
        }
        let Value::Mapping(mapping) = item else {
            return Err(format!(
                "configuration key '{key}' holds a list containing {}; expected a list of plain values",
                kind_of(item)
            ));
        };
        let mut pairs = Vec::new();
        for (map_key, map_value) in mapping {
            let (Some(k), Some(v)) = (scalar_text(map_key), scalar_text(map_value)) else {
                return Err(format!("configuration key '{key}' holds a list with a nested map; expected plain values"));
            };
            pairs.push(format!("{k}:{v}"));
        }
        parts.push(pairs.join(","));
    }
    Ok(parts.join(";"))
}

/// The string form of a scalar (string, number or bool), or `None` for anything else.
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(flag) => Some(flag.to_string()),
        _ => None,
    }
}

/// A short name for the kind of a YAML value, for error messages.
fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a map",
        Value::Tagged(_) => "a tagged value",
    }
}

fn display_prefix(prefix: &str) -> &str {
    if prefix.is_empty() { "the top level" } else { prefix }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn flat(text: &str) -> Vec<(String, String)> {
        match flatten_yaml(text, Path::new("/x/config.yaml")) {
            Ok(entries) => entries,
            Err(error) => panic!("flatten failed: {error}"),
        }
    }

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn empty_and_comment_only_documents_have_no_entries() {
        assert!(flat("").is_empty());
        assert!(flat("   \n\n").is_empty());
        assert!(flat("# just a comment\n").is_empty());
    }

    #[test]
    fn flat_keys_and_scalars() {
        let text = "parallelism.default: 4\nrest.port: 8082\npipeline.name: my job\n\
                    flag: true\nratio: 1.5\nrestart-strategy.type: off\nnothing: ~\n";
        assert_eq!(
            flat(text),
            pairs(&[
                ("parallelism.default", "4"),
                ("rest.port", "8082"),
                ("pipeline.name", "my job"),
                ("flag", "true"),
                ("ratio", "1.5"),
                ("restart-strategy.type", "off"),
            ])
        );
    }

    #[test]
    fn nested_maps_become_dotted_keys() {
        let text = "execution:\n  checkpointing:\n    interval: 10s\n    mode: AT_LEAST_ONCE\n\
                    parallelism:\n  default: 2\nstate.checkpoints:\n  dir: s3://bucket/cp\n";
        assert_eq!(
            flat(text),
            pairs(&[
                ("execution.checkpointing.interval", "10s"),
                ("execution.checkpointing.mode", "AT_LEAST_ONCE"),
                ("parallelism.default", "2"),
                ("state.checkpoints.dir", "s3://bucket/cp"),
            ])
        );
    }

    #[test]
    fn lists_join_with_semicolons() {
        let text = "pipeline.jars:\n  - a.jar\n  - b.jar\ninline: [1, two, ~, true]\nempty: []\n\
                    maps: [{a: 1, b: 2}, {c: 3}]\n";
        assert_eq!(
            flat(text),
            pairs(&[
                ("pipeline.jars", "a.jar;b.jar"),
                ("inline", "1;two;true"),
                ("empty", ""),
                ("maps", "a:1,b:2;c:3"),
            ])
        );
    }

    #[test]
    fn rejects_structures_that_are_not_options() {
        let path = Path::new("/x/config.yaml");
        let cases = [
            ("- a\n- b\n", "expected a map of configuration keys"),
            ("just text\n", "expected a map of configuration keys"),
            ("a: [[1, 2]]\n", "configuration key 'a' holds a list"),
            ("a: !tag 1\n", "yaml tags are not supported"),
            ("? [1, 2]\n: x\n", "keys must be plain text"),
            ("a.b: 1\na:\n  b: 2\n", "'a.b' is defined more than once"),
            ("a: b: c\n", "/x/config.yaml"),
            ("a: 1\n---\nb: 2\n", "invalid configuration file"),
        ];
        for (text, expected) in cases {
            let error = flatten_yaml(text, path).expect_err(text).to_string();
            assert!(error.contains(expected), "{text:?}: {error}");
            assert!(error.contains("/x/config.yaml"), "{error}");
            assert!(!error.contains('\n'), "{error}");
        }
    }

    /// A generated configuration tree: leaves are values, nodes are nested maps.
    #[derive(Debug, Clone)]
    enum Tree {
        Leaf(String),
        Node(BTreeMap<String, Tree>),
    }

    fn tree() -> impl Strategy<Value = BTreeMap<String, Tree>> {
        let leaf = "[a-z0-9:/. -]{0,8}[a-z0-9]".prop_map(Tree::Leaf);
        let node = leaf.prop_recursive(3, 24, 4, |inner| {
            prop::collection::btree_map("k[a-z0-9-]{0,5}", inner, 1..4).prop_map(Tree::Node)
        });
        prop::collection::btree_map("k[a-z0-9-]{0,5}", node, 1..5)
    }

    fn render_nested(map: &BTreeMap<String, Tree>, indent: usize, out: &mut String) {
        for (key, value) in map {
            out.push_str(&" ".repeat(indent));
            out.push_str(key);
            out.push(':');
            match value {
                Tree::Leaf(text) => {
                    out.push_str(&format!(" '{text}'\n"));
                }
                Tree::Node(inner) => {
                    out.push('\n');
                    render_nested(inner, indent + 2, out);
                }
            }
        }
    }

    fn render_flat(map: &BTreeMap<String, Tree>, prefix: &str, out: &mut String) {
        for (key, value) in map {
            let full = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            match value {
                Tree::Leaf(text) => out.push_str(&format!("{full}: '{text}'\n")),
                Tree::Node(inner) => render_flat(inner, &full, out),
            }
        }
    }

    proptest! {
        #[test]
        fn nested_yaml_flattens_to_the_flat_form(map in tree()) {
            let mut nested = String::new();
            render_nested(&map, 0, &mut nested);
            let mut flat_text = String::new();
            render_flat(&map, "", &mut flat_text);
            let path = Path::new("/x/config.yaml");
            let from_nested = flatten_yaml(&nested, path).map_err(|e| e.to_string());
            let from_flat = flatten_yaml(&flat_text, path).map_err(|e| e.to_string());
            prop_assert!(from_flat.is_ok(), "{:?}", from_flat);
            prop_assert_eq!(from_nested, from_flat);
        }
    }
}
