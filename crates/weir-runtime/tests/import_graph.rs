//! The module graph of weir-runtime has no import cycle longer than two files (issue 28: the
//! job master, the executors and the job graph imported each other in one cycle). Edges are
//! the `crate::` and `super::` paths of each file's code (comments and unit tests left out),
//! at file granularity.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `job_master/states/mod.rs` -> `job_master::states`.
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|last| last == "mod" || last == "lib") {
        parts.pop();
    }
    parts.join("::")
}

/// The code of a file without comments and without its unit tests.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    text.lines().filter(|line| !line.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// The paths after each occurrence of `prefix` (`crate::a::b` -> `a::b`).
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        rest = &rest[at + prefix.len()..];
        let path: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
        paths.push(path.trim_end_matches(':').to_string());
    }
    paths
}

fn resolve(modules: &BTreeSet<String>, path: &str) -> Option<String> {
    let segments: Vec<&str> = path.split("::").collect();
    (1..=segments.len()).rev().map(|n| segments[..n].join("::")).find(|candidate| modules.contains(candidate))
}

fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let module = module_of(&src, file);
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        let code = code_of(&text);
        let parent: Vec<&str> = module.split("::").collect();
        let parent = parent[..parent.len().saturating_sub(1)].join("::");
        let mut targets = BTreeSet::new();
        for path in paths_after(&code, "crate::") {
            targets.extend(resolve(&modules, &path));
        }
        for path in paths_after(&code, "super::") {
            let full = if parent.is_empty() { path } else { format!("{parent}::{path}") };
            targets.extend(resolve(&modules, &full));
        }
        targets.remove(&module);
        targets.remove("");
        graph.insert(module, targets);
    }
    graph
}

/// Strongly connected components (Tarjan), each sorted.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(walk: &mut Walk<'a>, node: &'a str) {
        let n = walk.index.len();
        walk.index.insert(node, n);
        walk.low.insert(node, n);
        walk.stack.push(node);
        walk.on_stack.insert(node);
        for next in walk.graph.get(node).into_iter().flatten() {
            let next = next.as_str();
            if !walk.index.contains_key(next) {
                visit(walk, next);
                let low = walk.low[node].min(walk.low[next]);
                walk.low.insert(node, low);
            } else if walk.on_stack.contains(next) {
                let low = walk.low[node].min(walk.index[next]);
                walk.low.insert(node, low);
            }
        }
        if walk.low[node] == walk.index[node] {
            let mut component = Vec::new();
            while let Some(top) = walk.stack.pop() {
                walk.on_stack.remove(top);
                component.push(top.to_string());
                if top == node {
                    break;
                }
            }
            component.sort();
            walk.found.push(component);
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !walk.index.contains_key(node.as_str()) {
            visit(&mut walk, node);
        }
    }
    walk.found.into_iter().filter(|component| component.len() > 1).collect()
}

#[test]
fn no_import_cycle_is_longer_than_two_files() {
    let graph = import_graph();
    assert!(graph.len() > 40, "the walk found too few modules ({}) to mean anything", graph.len());
    assert!(graph["executor"].contains("jobgraph"), "the graph misses a known import");
    let long: Vec<Vec<String>> = cycles(&graph).into_iter().filter(|c| c.len() > 2).collect();
    let shown: Vec<String> = long
        .iter()
        .map(|cycle| {
            let edges: Vec<String> = cycle
                .iter()
                .map(|m| format!("{m} -> {:?}", graph[m].iter().filter(|t| cycle.contains(t)).collect::<Vec<_>>()))
                .collect();
            edges.join("\n  ")
        })
        .collect();
    assert!(long.is_empty(), "modules of weir-runtime import each other in a cycle:\n  {}", shown.join("\n\n  "));
}
