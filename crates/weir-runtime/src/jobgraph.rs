//! The job graph: stream nodes grouped into chained tasks (job vertices) with resolved
//! parallelism and the job's max parallelism.

use weir_api::graph::{EdgeKind, NodeRole, StreamGraph};
use weir_types::keygroups::murmur3_32;
use weir_types::{MAX_PARALLELISM_UPPER_BOUND, compute_default_max_parallelism};

/// The defaults a job graph is built with: what the submitter set for operators that set
/// nothing themselves ([`crate::job_settings::JobSettings`] is one).
pub trait GraphDefaults {
    /// `parallelism.default` or `-p`.
    fn default_parallelism(&self) -> u32;
    /// `pipeline.max-parallelism`, if set (a restore sets the snapshot's).
    fn max_parallelism(&self) -> Option<u32>;
    /// `pipeline.auto-watermark-interval` in ms (`None`: Flink's 200 ms).
    fn auto_watermark_interval_ms(&self) -> Option<u64>;
}

/// Flink's default `pipeline.auto-watermark-interval`.
pub const DEFAULT_AUTO_WATERMARK_INTERVAL_MS: u64 = 200;

/// A task: one or more chained stream nodes run by each subtask in one thread.
#[derive(Clone, Debug, serde::Serialize)]
pub struct JobVertex {
    /// Stable id (32 hex characters) derived from the head operator's uid or position.
    pub id: String,
    /// Chained node names as Flink shows them: ` -> ` between an operator and the one it
    /// feeds, `A -> (B, C)` where it feeds several.
    pub name: String,
    /// The chained stream nodes, head first, each after the one feeding it.
    pub nodes: Vec<usize>,
    /// For each of `nodes`, the position in `nodes` of the operator feeding it (`None` for
    /// the head): a chain is a tree when an operator feeds several chained ones.
    #[serde(skip)]
    pub fed_by: Vec<Option<usize>>,
    /// Parallelism of every node in the chain.
    pub parallelism: u32,
    /// Uids of the chained operators (given or generated), head first.
    pub uids: Vec<String>,
}

/// An exchange between two vertices.
#[derive(Clone, Debug, serde::Serialize)]
pub struct JobEdge {
    /// The producing vertex.
    pub source_vertex: usize,
    /// The producing node (the tail of its chain or any chained node with this consumer).
    pub source_node: usize,
    /// The consuming vertex.
    pub target_vertex: usize,
    /// The consuming node (the head of its vertex).
    pub target_node: usize,
    /// True when subtask i sends only to subtask i.
    pub forward: bool,
    /// `FORWARD`, `REBALANCE` or `HASH`, as Flink's plan shows.
    pub ship_strategy: &'static str,
    /// Which of the target node's inputs this edge is.
    pub input_index: usize,
}

/// The job graph.
#[derive(Clone, Debug, serde::Serialize)]
pub struct JobGraph {
    /// The job's name.
    pub job_name: String,
    /// Key groups of the job.
    pub max_parallelism: u32,
    /// Tasks, in a topological order.
    pub vertices: Vec<JobVertex>,
    /// Exchanges between tasks.
    pub edges: Vec<JobEdge>,
    /// For each stream node, the vertex it runs in.
    pub vertex_of_node: Vec<usize>,
    /// How often watermark strategies emit, ms.
    pub auto_watermark_interval_ms: u64,
}

/// Why a job graph cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum JobGraphError {
    /// A parallelism outside (0, 32768].
    #[error(
        "operator '{operator}': parallelism {parallelism} is out of range; it must be between 1 and {MAX_PARALLELISM_UPPER_BOUND}"
    )]
    BadParallelism {
        /// The operator.
        operator: String,
        /// The bad value.
        parallelism: u32,
    },
    /// Max parallelism outside (0, 32768].
    #[error("max parallelism {0} is out of range; it must be between 1 and {MAX_PARALLELISM_UPPER_BOUND}")]
    BadMaxParallelism(u32),
    /// A parallelism above the max parallelism.
    #[error(
        "operator '{operator}' has parallelism {parallelism}, above the job's max parallelism {max_parallelism}; lower the parallelism or raise pipeline.max-parallelism (it is fixed when the job first starts)"
    )]
    ParallelismAboveMax {
        /// The operator.
        operator: String,
        /// Its parallelism.
        parallelism: u32,
        /// The job's max parallelism.
        max_parallelism: u32,
    },
}

impl JobGraph {
    /// Resolves parallelism, picks the max parallelism and chains `graph`.
    pub fn build(graph: &StreamGraph, settings: &impl GraphDefaults) -> Result<JobGraph, JobGraphError> {
        let (parallelism, max_parallelism) = resolve_parallelism(graph, settings)?;
        let (vertices, vertex_of_node) = chain(graph, &parallelism);
        let edges = vertex_edges(graph, &parallelism, &vertex_of_node);
        Ok(JobGraph {
            job_name: graph.job_name.clone(),
            max_parallelism,
            vertices,
            edges,
            vertex_of_node,
            auto_watermark_interval_ms: settings
                .auto_watermark_interval_ms()
                .unwrap_or(DEFAULT_AUTO_WATERMARK_INTERVAL_MS),
        })
    }

    /// Edges into `vertex`.
    pub fn inputs_of(&self, vertex: usize) -> impl Iterator<Item = (usize, &JobEdge)> {
        self.edges.iter().enumerate().filter(move |(_, e)| e.target_vertex == vertex)
    }

    /// The pipelined region of each vertex: vertices connected by any edge share a region
    /// (a streaming job's edges are all pipelined), numbered from 0 in vertex order.
    pub fn regions(&self) -> Vec<usize> {
        let mut parent: Vec<usize> = (0..self.vertices.len()).collect();
        fn root(parent: &mut [usize], mut v: usize) -> usize {
            while parent[v] != v {
                parent[v] = parent[parent[v]];
                v = parent[v];
            }
            v
        }
        for edge in &self.edges {
            let (a, b) = (root(&mut parent, edge.source_vertex), root(&mut parent, edge.target_vertex));
            if a != b {
                parent[a.max(b)] = a.min(b);
            }
        }
        let mut numbers = std::collections::HashMap::new();
        let mut regions = Vec::with_capacity(self.vertices.len());
        for v in 0..self.vertices.len() {
            let r = root(&mut parent, v);
            let next = numbers.len();
            regions.push(*numbers.entry(r).or_insert(next));
        }
        regions
    }

    /// Zeroed counters for every subtask, by vertex (one set per deploy).
    pub fn new_task_metrics(&self) -> Vec<Vec<std::sync::Arc<weir_api::operator::TaskMetrics>>> {
        self.vertices
            .iter()
            .map(|v| {
                (0..v.parallelism)
                    .map(|_| std::sync::Arc::new(weir_api::operator::TaskMetrics::for_chain(&v.uids, &v.fed_by)))
                    .collect()
            })
            .collect()
    }

    /// Total subtasks (slots an embedded cluster provides).
    pub fn subtask_count(&self) -> u32 {
        self.vertices.iter().map(|v| v.parallelism).sum()
    }
}

/// Each node's parallelism (its own, the graph's, or the default) and the job's max
/// parallelism (set, or computed from the highest), each checked against the bounds.
fn resolve_parallelism(graph: &StreamGraph, settings: &impl GraphDefaults) -> Result<(Vec<u32>, u32), JobGraphError> {
    let nodes = graph.nodes();
    let mut parallelism = Vec::with_capacity(nodes.len());
    for node in nodes {
        let p = node.parallelism.or(graph.parallelism).unwrap_or(settings.default_parallelism());
        if p == 0 || p > MAX_PARALLELISM_UPPER_BOUND {
            return Err(JobGraphError::BadParallelism { operator: node.name.clone(), parallelism: p });
        }
        parallelism.push(p);
    }
    let highest = parallelism.iter().copied().max().unwrap_or(1);
    let max_parallelism = match graph.max_parallelism.or(settings.max_parallelism()) {
        Some(max) if max == 0 || max > MAX_PARALLELISM_UPPER_BOUND => {
            return Err(JobGraphError::BadMaxParallelism(max));
        }
        Some(max) => max,
        None => compute_default_max_parallelism(highest),
    };
    for (node, p) in nodes.iter().zip(&parallelism) {
        if *p > max_parallelism {
            return Err(JobGraphError::ParallelismAboveMax {
                operator: node.name.clone(),
                parallelism: *p,
                max_parallelism,
            });
        }
    }
    Ok((parallelism, max_parallelism))
}

/// Chains the nodes into vertices: a node joins its producer's vertex when the edge is
/// forward and the parallelism is equal, as Flink chains. A producer may feed several
/// chained nodes (the chain is then a tree: its records go to each, the last one by move)
/// besides nodes of other vertices. The vertices, and each node's vertex.
fn chain(graph: &StreamGraph, parallelism: &[u32]) -> (Vec<JobVertex>, Vec<usize>) {
    let nodes = graph.nodes();
    let mut vertex_of_node = vec![usize::MAX; nodes.len()];
    let mut vertices: Vec<JobVertex> = Vec::new();
    for node in nodes {
        let chain_into = match node.inputs.first() {
            Some(edge)
                if node.role != NodeRole::Source
                    && node.inputs.len() == 1
                    && edge.side.is_none()
                    && edge.kind == EdgeKind::Auto
                    && parallelism[edge.source] == parallelism[node.id] =>
            {
                Some((vertex_of_node[edge.source], edge.source))
            }
            _ => None,
        };
        match chain_into {
            Some((vertex, producer)) => {
                let v = &mut vertices[vertex];
                let producer_position = v.nodes.iter().position(|n| *n == producer);
                v.nodes.push(node.id);
                v.fed_by.push(producer_position);
                v.uids.push(node.uid_or_generated());
                vertex_of_node[node.id] = vertex;
            }
            None => {
                let uid = node.uid_or_generated();
                vertices.push(JobVertex {
                    id: vertex_id(&uid),
                    name: String::new(),
                    nodes: vec![node.id],
                    fed_by: vec![None],
                    parallelism: parallelism[node.id],
                    uids: vec![uid],
                });
                vertex_of_node[node.id] = vertices.len() - 1;
            }
        }
    }
    for vertex in &mut vertices {
        vertex.name = chain_name(graph, vertex, 0);
    }
    (vertices, vertex_of_node)
}

/// The name of the part of `vertex`'s chain that starts at position `position`, as Flink's
/// `createChainedName`: `A -> B` where A feeds one chained operator, `A -> (B, C)` where it
/// feeds several.
fn chain_name(graph: &StreamGraph, vertex: &JobVertex, position: usize) -> String {
    let node = &graph.nodes()[vertex.nodes[position]];
    let mut name = display_name(&node.name, node.role);
    let fed: Vec<String> = (0..vertex.nodes.len())
        .filter(|&p| vertex.fed_by[p] == Some(position))
        .map(|p| chain_name(graph, vertex, p))
        .collect();
    match fed.as_slice() {
        [] => {}
        [only] => {
            name.push_str(" -> ");
            name.push_str(only);
        }
        several => {
            name.push_str(" -> (");
            name.push_str(&several.join(", "));
            name.push(')');
        }
    }
    name
}

/// The edges between vertices (edges inside a chain are not among them), with Flink's ship
/// strategy names.
fn vertex_edges(graph: &StreamGraph, parallelism: &[u32], vertex_of_node: &[usize]) -> Vec<JobEdge> {
    let mut edges = Vec::new();
    for node in graph.nodes() {
        for (input_index, edge) in node.inputs.iter().enumerate() {
            let source_vertex = vertex_of_node[edge.source];
            let target_vertex = vertex_of_node[node.id];
            if source_vertex == target_vertex {
                continue;
            }
            let same_parallelism = parallelism[edge.source] == parallelism[node.id];
            let forward = edge.kind == EdgeKind::Auto && same_parallelism;
            let ship_strategy = match edge.kind {
                EdgeKind::Hash => "HASH",
                EdgeKind::Broadcast => "BROADCAST",
                EdgeKind::Auto if forward => "FORWARD",
                EdgeKind::Auto | EdgeKind::Rebalance => "REBALANCE",
            };
            edges.push(JobEdge {
                source_vertex,
                source_node: edge.source,
                target_vertex,
                target_node: node.id,
                forward,
                ship_strategy,
                input_index,
            });
        }
    }
    edges
}

fn display_name(name: &str, role: NodeRole) -> String {
    match role {
        NodeRole::Source if !name.starts_with("Source:") => format!("Source: {name}"),
        NodeRole::Sink if !name.starts_with("Sink:") => format!("Sink: {name}"),
        _ => name.to_string(),
    }
}

/// The id of the operator whose uid (given or generated) is `uid`: 32 hex characters, as
/// Flink's `OperatorID`; a vertex's id is its head operator's, as in Flink.
pub fn operator_id(uid: &str) -> String {
    vertex_id(uid)
}

/// 32 hex characters from four seeded murmur hashes of the uid: stable across runs.
fn vertex_id(uid: &str) -> String {
    let mut id = String::with_capacity(32);
    for seed in ["a", "b", "c", "d"] {
        let hash = murmur3_32(format!("{seed}:{uid}").as_bytes());
        id.push_str(&format!("{hash:08x}"));
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job_settings::JobSettings;
    use weir_api::prelude::*;

    fn counter_like(env: &StreamExecutionEnvironment) {
        #[derive(Clone)]
        struct Count(ValueState<u64>);
        impl KeyedProcessFunction<u64, u64, (u64, u64)> for Count {
            fn states(&self) -> Vec<weir_state::StateDeclaration> {
                vec![self.0.declaration()]
            }

            fn process_element(
                &mut self,
                r: u64,
                ctx: &mut KeyedContext<'_, u64>,
                out: &mut Collector<'_, (u64, u64)>,
            ) -> FnResult {
                let mut c = ctx.value(&self.0)?;
                let n = c.get_or_insert_with(|| 0);
                *n += 1;
                out.collect((r, *n));
                Ok(())
            }
        }
        env.from_source(VecSource::new(vec![1u64, 2, 3]))
            .uid("source")
            .map(|x| x + 1)
            .key_by(|x: &u64| *x)
            .process(Count(ValueState::new("count")))
            .uid("counter")
            .sink_to(CollectSink::default())
            .uid("sink");
    }

    /// Emits each record (a keyed consumer that breaks the chain).
    #[derive(Clone)]
    struct KeyedEcho;
    impl KeyedProcessFunction<u64, u64, u64> for KeyedEcho {
        fn process_element(
            &mut self,
            r: u64,
            _ctx: &mut KeyedContext<'_, u64>,
            out: &mut Collector<'_, u64>,
        ) -> FnResult {
            out.collect(r);
            Ok(())
        }
    }

    #[test]
    fn forward_operators_of_equal_parallelism_are_chained() {
        let env = StreamExecutionEnvironment::new();
        counter_like(&env);
        let graph = env.build("t").unwrap();
        let job = JobGraph::build(&graph, &JobSettings::with_parallelism(2)).unwrap();
        assert_eq!(job.vertices.len(), 2);
        assert_eq!(job.vertices[0].name, "Source: Custom Source -> Map");
        assert_eq!(job.vertices[1].name, "KeyedProcess -> Sink: Unnamed");
        assert_eq!(job.edges.len(), 1);
        assert_eq!(job.edges[0].ship_strategy, "HASH");
        assert_eq!(job.max_parallelism, 128);
        assert_eq!(job.vertices[1].uids, vec!["counter".to_string(), "sink".to_string()]);
    }

    #[test]
    fn an_operator_feeding_several_chains_them_all_as_a_tree() {
        let env = StreamExecutionEnvironment::new();
        let numbers = env.from_source(VecSource::new(vec![1u64, 2, 3])).uid("source");
        numbers.map(|x| x + 1).uid("plus").filter(|x| *x > 1).uid("big").sink_to(CollectSink::default()).uid("a");
        numbers.map(|x| x * 2).uid("twice").sink_to(CollectSink::default()).uid("b");
        numbers.key_by(|x: &u64| *x).process(KeyedEcho).uid("keyed").sink_to(CollectSink::default()).uid("c");
        let graph = env.build("t").unwrap();
        let job = JobGraph::build(&graph, &JobSettings::with_parallelism(2)).unwrap();
        assert_eq!(job.vertices.len(), 2, "{:?}", job.vertices);
        let head = &job.vertices[0];
        assert_eq!(head.name, "Source: Custom Source -> (Map -> Filter -> Sink: Unnamed, Map -> Sink: Unnamed)");
        assert_eq!(head.uids, ["source", "plus", "big", "a", "twice", "b"].map(String::from).to_vec());
        assert_eq!(head.fed_by, vec![None, Some(0), Some(1), Some(2), Some(0), Some(4)]);
        // The keyed consumer is a vertex of its own, fed by the head's tree.
        assert_eq!(job.edges.len(), 1);
        assert_eq!(job.edges[0].ship_strategy, "HASH");
        let metrics = &job.new_task_metrics()[0][0];
        let fed_by: Vec<Option<usize>> = metrics.operators.iter().map(|o| o.fed_by).collect();
        assert_eq!(fed_by, head.fed_by);
    }

    #[test]
    fn different_parallelism_breaks_the_chain_with_rebalance() {
        let env = StreamExecutionEnvironment::new();
        env.from_source(VecSource::new(vec![1u64]))
            .parallelism(1)
            .map(|x| x)
            .parallelism(3)
            .sink_to(CollectSink::default());
        let graph = env.build("t").unwrap();
        let job = JobGraph::build(&graph, &JobSettings::with_parallelism(3)).unwrap();
        assert_eq!(job.vertices.len(), 2);
        assert_eq!(job.edges[0].ship_strategy, "REBALANCE");
    }

    #[test]
    fn parallelism_above_max_names_both_numbers() {
        let env = StreamExecutionEnvironment::new();
        counter_like(&env);
        let graph = env.build("t").unwrap();
        let err =
            JobGraph::build(&graph, &JobSettings { max_parallelism: Some(128), ..JobSettings::with_parallelism(256) })
                .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("256") && text.contains("128"), "{text}");
    }

    #[test]
    fn disconnected_pipelines_are_separate_regions() {
        let env = StreamExecutionEnvironment::new();
        env.from_source(VecSource::new(vec![1u64])).map(|x| x).parallelism(2).sink_to(CollectSink::default());
        counter_like(&env);
        let graph = env.build("t").unwrap();
        let job = JobGraph::build(&graph, &JobSettings::with_parallelism(1)).unwrap();
        let regions = job.regions();
        assert_eq!(regions.len(), job.vertices.len());
        let first = regions[job.vertex_of_node[0]];
        let last = regions[job.vertex_of_node[graph.nodes().len() - 1]];
        assert_ne!(first, last);
        assert_eq!(regions.iter().max(), Some(&1));
    }

    #[test]
    fn vertex_ids_are_stable_32_hex() {
        let id = vertex_id("counter");
        assert_eq!(id.len(), 32);
        assert_eq!(id, vertex_id("counter"));
        assert_ne!(id, vertex_id("source"));
    }
}
