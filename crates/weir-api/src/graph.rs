//! The stream graph: nodes (sources, operators, sinks) and the edges between them, with
//! type-erased factories the runtime uses to build chains, channels and task bodies.
//!
//! Types are erased here because a job graph is data the runtime walks without knowing the
//! record types; each node carries a [`StreamType`] for its output type that knows how to
//! make that type's channels, channel outputs and input bodies.

use std::any::Any;
use std::sync::Arc;

use crate::Data;
use crate::error::TaskError;
use crate::exchange::{ChannelOutput, ChannelReceiver, ChannelSender, InputBody, Partitioner, channel};
use crate::operator::{Discard, Operator, TaskBody, TaskContext, Tee};

/// A `Box<dyn Operator<T>>` with `T` erased.
pub type ErasedOperator = Box<dyn Any + Send>;
/// A channel end with its element type erased.
pub type ErasedChannelEnd = Box<dyn Any + Send>;

/// Builds a source subtask's body given the chain after the source.
pub type SourceFactory =
    Arc<dyn Fn(&TaskContext, ErasedOperator) -> Result<Box<dyn TaskBody>, TaskError> + Send + Sync>;
/// Builds an operator link given the link after it.
pub type OperatorFactory = Arc<dyn Fn(&TaskContext, ErasedOperator) -> Result<ErasedOperator, TaskError> + Send + Sync>;

/// Checks a restored state's elements: refuses with a reason, or returns lines for the user.
pub type RestoreCheckFn = Arc<dyn Fn(&[Vec<u8>]) -> Result<Vec<String>, String> + Send + Sync>;

/// A pre-flight check of one of a node's operator states in a snapshot, run before a
/// restored job starts (every old subtask's elements of state `state`): an error refuses the
/// restore; the lines tell the user what the restore will do.
#[derive(Clone)]
pub struct RestoreCheck {
    /// The operator state checked (`source-positions`, `sink-committables`).
    pub state: &'static str,
    /// The check.
    pub check: RestoreCheckFn,
}

/// What a node does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeRole {
    /// Produces records.
    Source,
    /// Transforms records.
    Operator,
    /// Consumes records.
    Sink,
}

/// How an edge distributes records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum EdgeKind {
    /// Forward when both sides have equal parallelism (and then chainable), else rebalance.
    Auto,
    /// Round-robin.
    Rebalance,
    /// By key group.
    Hash,
    /// Every record to every consumer subtask (the broadcast state pattern).
    Broadcast,
}

/// An input of a node.
#[derive(Clone)]
pub struct StreamEdge {
    /// The producing node's index.
    pub source: usize,
    /// How records are distributed.
    pub kind: EdgeKind,
    /// For [`EdgeKind::Hash`]: an `Arc<dyn Fn(&T) -> u32>` giving the key's stable hash.
    pub(crate) key_hash: Option<Arc<dyn Any + Send + Sync>>,
    /// Set when the edge carries a side output of the source node instead of its main output.
    pub side: Option<Arc<SideEdge>>,
}

/// What a side-output edge carries: the tag and the side records' type.
pub struct SideEdge {
    /// The output tag's name.
    pub tag: String,
    /// Operations on the side records' type.
    pub(crate) stream_type: Arc<dyn StreamType>,
}

impl SideEdge {
    /// Operations on the side records' type.
    pub fn stream_type(&self) -> &Arc<dyn StreamType> {
        &self.stream_type
    }
}

/// One node of the graph.
pub struct StreamNode {
    /// Index in the graph (creation order, which is a topological order).
    pub id: usize,
    /// Display name.
    pub name: String,
    /// Stable identity across job versions; state is matched by it.
    pub uid: Option<String>,
    /// Explicit parallelism, if set.
    pub parallelism: Option<u32>,
    /// Source, operator or sink.
    pub role: NodeRole,
    /// True when the node holds keyed state.
    pub keyed: bool,
    /// The Rust type name of the key, for keyed nodes (checked against snapshots).
    pub key_type: Option<&'static str>,
    /// For keyed nodes: the states the function declares (checked against snapshots before
    /// a restore starts).
    pub declared_states: Vec<weir_state::StateDeclaration>,
    /// Inputs.
    pub inputs: Vec<StreamEdge>,
    /// For sinks: where only this sink may write ([`crate::sink::Sink::exclusive_target`]).
    pub exclusive_target: Option<String>,
    /// For sinks: it prints its records to the process's stdout ([`crate::sink::Sink::writes_to_stdout`]).
    pub writes_to_stdout: bool,
    /// For sources and sinks: the check of their restored state before a restore starts.
    pub restore_check: Option<RestoreCheck>,
    pub(crate) source_factory: Option<SourceFactory>,
    pub(crate) operator_factory: Option<OperatorFactory>,
    pub(crate) output_type: Arc<dyn StreamType>,
}

impl StreamNode {
    /// The factory of a source node.
    pub fn source_factory(&self) -> Option<&SourceFactory> {
        self.source_factory.as_ref()
    }

    /// The factory of an operator or sink node.
    pub fn operator_factory(&self) -> Option<&OperatorFactory> {
        self.operator_factory.as_ref()
    }

    /// Operations on this node's output type.
    pub fn output_type(&self) -> &Arc<dyn StreamType> {
        &self.output_type
    }

    /// The uid, or a name derived from the node's position when none was set.
    pub fn uid_or_generated(&self) -> String {
        match &self.uid {
            Some(uid) => uid.clone(),
            None => format!("node-{}", self.id),
        }
    }
}

/// A job's graph as the API built it, before chaining.
pub struct StreamGraph {
    /// The job's name.
    pub job_name: String,
    /// Max parallelism set in code (`set_max_parallelism`), if any.
    pub max_parallelism: Option<u32>,
    /// Default parallelism set in code (`set_parallelism`), if any.
    pub parallelism: Option<u32>,
    pub(crate) nodes: Vec<StreamNode>,
}

impl StreamGraph {
    /// Whether a sink of the job prints to stdout: `weir run` then keeps stdout for the
    /// records and writes its own lines to stderr.
    pub fn writes_to_stdout(&self) -> bool {
        self.nodes.iter().any(|node| node.writes_to_stdout)
    }

    /// The nodes, in a topological order.
    pub fn nodes(&self) -> &[StreamNode] {
        &self.nodes
    }

    /// The type of the records `edge` carries: its source's output, or a side output's.
    pub fn edge_type<'a>(&'a self, edge: &'a StreamEdge) -> &'a Arc<dyn StreamType> {
        match &edge.side {
            Some(side) => &side.stream_type,
            None => self.nodes[edge.source].output_type(),
        }
    }

    /// The nodes that read `node`'s output, with the edge they read it through.
    pub fn consumers(&self, node: usize) -> Vec<(usize, &StreamEdge)> {
        let mut out = Vec::new();
        for candidate in &self.nodes {
            for edge in &candidate.inputs {
                if edge.source == node {
                    out.push((candidate.id, edge));
                }
            }
        }
        out
    }
}

/// Errors in a graph the API built.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// Two operators share a uid.
    #[error("uid '{0}' is used by more than one operator; every uid must be unique in a job")]
    DuplicateUid(String),
    /// A parallelism outside (0, 32768].
    #[error("operator '{name}': parallelism {parallelism} is out of range; it must be between 1 and 32768")]
    BadParallelism {
        /// The operator.
        name: String,
        /// The bad value.
        parallelism: u32,
    },
    /// A max parallelism outside (0, 32768].
    #[error("max parallelism {0} is out of range; it must be between 1 and 32768")]
    BadMaxParallelism(u32),
    /// The graph has no source.
    #[error("the job has no source; add one with env.from_source(..)")]
    NoSource,
    /// Two sinks write to the same place.
    #[error(
        "sinks '{first}' and '{second}' both write to {target}; their files would collide: give each sink its own directory"
    )]
    SharedSinkTarget {
        /// The first sink's uid or name.
        first: String,
        /// The second sink's uid or name.
        second: String,
        /// Where both write.
        target: String,
    },
}

/// Operations on one record type, for the runtime that cannot name the type.
pub trait StreamType: Send + Sync {
    /// A link that drops records of this type.
    fn discard(&self) -> ErasedOperator;
    /// A link that copies batches to each of `outputs`.
    fn tee(&self, outputs: Vec<ErasedOperator>) -> Result<ErasedOperator, TaskError>;
    /// `link`, counting the records that pass into it as operator `operator`'s output in
    /// `metrics`.
    fn metered(
        &self,
        link: ErasedOperator,
        metrics: Arc<crate::operator::TaskMetrics>,
        operator: usize,
    ) -> Result<ErasedOperator, TaskError>;
    /// A new bounded channel: (sender, receiver).
    fn channel(&self) -> (ErasedChannelEnd, ErasedChannelEnd);
    /// The tail link sending to `senders` as `edge` says.
    fn channel_output(
        &self,
        edge: &StreamEdge,
        forward: bool,
        senders: Vec<ErasedChannelEnd>,
        ctx: &TaskContext,
    ) -> Result<ErasedOperator, TaskError>;
    /// Bridges a local channel's receiving end to a TCP connection towards a consumer in
    /// another process (credit-based; see [`crate::network`]), counting the bytes sent in
    /// the producing subtask's `metrics`.
    fn remote_sender(
        &self,
        local: ErasedChannelEnd,
        stream: std::net::TcpStream,
        metrics: Arc<crate::operator::TaskMetrics>,
    ) -> Result<Vec<std::thread::JoinHandle<()>>, TaskError>;
    /// Feeds a local channel's sending end from a TCP connection of a producer in another
    /// process, counting the bytes received in the consuming subtask's `metrics`.
    fn remote_receiver(
        &self,
        local: ErasedChannelEnd,
        stream: std::net::TcpStream,
        metrics: Arc<crate::operator::TaskMetrics>,
    ) -> Result<std::thread::JoinHandle<()>, TaskError>;
    /// `link` (a link of this type) as a side output link of another operator.
    fn side_link(&self, link: ErasedOperator) -> Result<Box<dyn crate::side_output::SideLink>, TaskError>;
    /// The body of a subtask reading `receivers` into `head`.
    fn input_body(
        &self,
        receivers: Vec<ErasedChannelEnd>,
        head: ErasedOperator,
        ctx: &TaskContext,
    ) -> Result<Box<dyn TaskBody>, TaskError>;
}

/// [`StreamType`] for records of type `T`.
pub struct TypedStream<T>(std::marker::PhantomData<fn() -> T>);

impl<T> TypedStream<T> {
    /// The operations for `T`.
    pub fn erased() -> Arc<dyn StreamType>
    where
        T: Data,
    {
        Arc::new(TypedStream::<T>(std::marker::PhantomData))
    }
}

/// Unboxes a type-erased value, or reports which wiring step got the wrong type.
pub fn downcast<X: 'static>(erased: Box<dyn Any + Send>, what: &str) -> Result<X, TaskError> {
    match erased.downcast::<X>() {
        Ok(value) => Ok(*value),
        Err(_) => Err(TaskError::Internal(format!("{what}: wrong record type while wiring the job graph"))),
    }
}

impl<T: Data> StreamType for TypedStream<T> {
    fn discard(&self) -> ErasedOperator {
        let op: Box<dyn Operator<T>> = Box::new(Discard);
        Box::new(op)
    }

    fn tee(&self, outputs: Vec<ErasedOperator>) -> Result<ErasedOperator, TaskError> {
        let mut typed = Vec::with_capacity(outputs.len());
        for output in outputs {
            typed.push(downcast::<Box<dyn Operator<T>>>(output, "tee output")?);
        }
        let op: Box<dyn Operator<T>> = Box::new(Tee::new(typed));
        Ok(Box::new(op))
    }

    fn metered(
        &self,
        link: ErasedOperator,
        metrics: Arc<crate::operator::TaskMetrics>,
        operator: usize,
    ) -> Result<ErasedOperator, TaskError> {
        let inner = downcast::<Box<dyn Operator<T>>>(link, "metered link")?;
        let op: Box<dyn Operator<T>> = Box::new(crate::operator::Metered::new(inner, metrics, operator));
        Ok(Box::new(op))
    }

    fn channel(&self) -> (ErasedChannelEnd, ErasedChannelEnd) {
        let (sender, receiver) = channel::<T>();
        (Box::new(sender), Box::new(receiver))
    }

    fn channel_output(
        &self,
        edge: &StreamEdge,
        forward: bool,
        senders: Vec<ErasedChannelEnd>,
        ctx: &TaskContext,
    ) -> Result<ErasedOperator, TaskError> {
        let mut typed = Vec::with_capacity(senders.len());
        for sender in senders {
            typed.push(downcast::<ChannelSender<T>>(sender, "channel sender")?);
        }
        let partitioner = match (edge.kind, &edge.key_hash) {
            (EdgeKind::Hash, Some(hash)) => {
                let hash = Arc::clone(hash);
                match hash.downcast::<Arc<dyn Fn(&T) -> u32 + Send + Sync>>() {
                    Ok(hash) => Partitioner::KeyGroups(Arc::clone(&hash)),
                    Err(_) => {
                        return Err(TaskError::Internal("key selector: wrong record type".into()));
                    }
                }
            }
            (EdgeKind::Hash, None) => {
                return Err(TaskError::Internal("hash edge without a key selector".into()));
            }
            (EdgeKind::Broadcast, _) => Partitioner::Broadcast,
            (EdgeKind::Auto, _) if forward => Partitioner::Forward,
            (EdgeKind::Auto | EdgeKind::Rebalance, _) => Partitioner::Rebalance,
        };
        let op: Box<dyn Operator<T>> = Box::new(ChannelOutput::new(partitioner, typed, ctx));
        Ok(Box::new(op))
    }

    fn remote_sender(
        &self,
        local: ErasedChannelEnd,
        stream: std::net::TcpStream,
        metrics: Arc<crate::operator::TaskMetrics>,
    ) -> Result<Vec<std::thread::JoinHandle<()>>, TaskError> {
        let local = downcast::<ChannelReceiver<T>>(local, "remote sender")?;
        crate::network::bridge_sender(local, stream, metrics)
            .map_err(|e| TaskError::external("starting a network channel", e))
    }

    fn remote_receiver(
        &self,
        local: ErasedChannelEnd,
        stream: std::net::TcpStream,
        metrics: Arc<crate::operator::TaskMetrics>,
    ) -> Result<std::thread::JoinHandle<()>, TaskError> {
        let local = downcast::<ChannelSender<T>>(local, "remote receiver")?;
        crate::network::bridge_receiver(local, stream, metrics)
            .map_err(|e| TaskError::external("starting a network channel", e))
    }

    fn side_link(&self, link: ErasedOperator) -> Result<Box<dyn crate::side_output::SideLink>, TaskError> {
        let link = downcast::<Box<dyn Operator<T>>>(link, "side output")?;
        Ok(Box::new(crate::side_output::TypedSideLink::new(link)))
    }

    fn input_body(
        &self,
        receivers: Vec<ErasedChannelEnd>,
        head: ErasedOperator,
        ctx: &TaskContext,
    ) -> Result<Box<dyn TaskBody>, TaskError> {
        let mut typed = Vec::with_capacity(receivers.len());
        for receiver in receivers {
            typed.push(downcast::<ChannelReceiver<T>>(receiver, "channel receiver")?);
        }
        let head = downcast::<Box<dyn Operator<T>>>(head, "input head")?;
        Ok(Box::new(InputBody::new(typed, head, ctx)?))
    }
}
