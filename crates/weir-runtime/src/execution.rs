//! Deploying a job graph: channels between subtasks and one thread per subtask running its
//! chain, reporting every state change to the job master.

use std::collections::HashMap;
use std::net::TcpStream;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use weir_api::error::TaskError;
use weir_api::graph::{ErasedChannelEnd, ErasedOperator, NodeRole, StreamGraph};
use weir_api::operator::{Clock, Step, TaskBody, TaskContext, TaskMetrics};
use weir_api::snapshot::{SnapshotSink, TaskControl, TaskSnapshot};
use weir_types::JobId;

use crate::checkpointing::RestoreSource;
use crate::checkpointing::ended::EndedCheckpoints;
use crate::checkpointing::incremental::IncrementalTracker;
use crate::checkpointing::writer::WriteJob;
use crate::jobgraph::JobGraph;

/// What a subtask reports to its job master.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct TaskEvent {
    /// The subtask's vertex.
    pub vertex: usize,
    /// The subtask's index.
    pub subtask: u32,
    /// What happened.
    pub kind: TaskEventKind,
}

/// The subtask state changes a job master hears about.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum TaskEventKind {
    /// Building the chain (and, later, restoring state).
    Initializing,
    /// Processing records.
    Running,
    /// Its input ended; it waits for the job's final checkpoint (still RUNNING).
    EndOfData,
    /// All input ended and all output closed.
    Finished,
    /// Failed with an error.
    Failed(TaskError),
    /// Stopped because the job asked it to.
    Canceled,
}

/// Checkpointing wiring of a deployment.
#[derive(Clone)]
pub struct CheckpointWiring {
    /// Align barriers (exactly-once) or not.
    pub exactly_once: bool,
    /// The checkpoints that ended (a late snapshot of one is not written).
    pub ended: Arc<EndedCheckpoints>,
    /// The writer pool's queue.
    pub writer: Sender<WriteJob>,
    /// Incremental checkpoints, every n-th full (`Some(n)`), or full ones (`None`).
    pub incremental: Option<u32>,
    /// `state.backend.type: spillable`: how keyed state spills; `None` for `hashmap`.
    pub spill: Option<weir_state::spill::SpillOptions>,
    /// The snapshot a job restores from.
    pub restore: Option<Arc<RestoreSource>>,
    /// Periodic checkpoints are on: tasks wait at the end of their input for the job's final
    /// checkpoint (see `TaskContext::end_of_data`).
    pub final_checkpoint: bool,
}

/// Which subtasks run in this process, and how channels reach the others.
#[derive(Clone)]
pub struct Placement {
    /// True when subtask `(vertex, subtask)` runs here.
    pub is_local: Arc<dyn Fn(usize, u32) -> bool + Send + Sync>,
    /// Connections to subtasks in other processes (`None`: everything is local).
    pub network: Option<Arc<dyn NetworkWiring>>,
}

impl Placement {
    /// Every subtask in this process (the embedded cluster).
    pub fn all_local() -> Placement {
        Placement { is_local: Arc::new(|_, _| true), network: None }
    }
}

/// Opens the TCP connections of channels that cross processes.
pub trait NetworkWiring: Send + Sync {
    /// Connects the producer side of `(edge, producer, consumer)` to the process running
    /// subtask `consumer` of vertex `target_vertex`.
    fn connect(&self, edge: usize, target_vertex: usize, producer: u32, consumer: u32) -> Result<TcpStream, TaskError>;
    /// Waits for the producer of `(edge, producer, consumer)` to connect to this process.
    fn accept(&self, edge: usize, producer: u32, consumer: u32) -> Result<TcpStream, TaskError>;
}

/// Starts the thread that bridges one channel to or from another process; failures close
/// the local end, which the task sees as a vanished peer.
/// `metrics` are the local subtask's: the bytes it sends or receives are counted there.
fn bridge(
    output_type: Arc<dyn weir_api::graph::StreamType>,
    network: Arc<dyn NetworkWiring>,
    (local, metrics): (ErasedChannelEnd, Arc<TaskMetrics>),
    outbound: bool,
    (edge, target_vertex, producer, consumer): (usize, usize, u32, u32),
) -> Result<(), TaskError> {
    if outbound {
        // Counted on before the subtask can finish; the bridge takes itself off.
        metrics.bridges_sending.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    std::thread::Builder::new()
        .name(format!("weir-net-{edge}-{producer}-{consumer}"))
        .spawn(move || {
            let counted = Arc::clone(&metrics);
            let result = if outbound {
                network
                    .connect(edge, target_vertex, producer, consumer)
                    .and_then(|stream| output_type.remote_sender(local, stream, metrics).map(|_| ()))
            } else {
                network
                    .accept(edge, producer, consumer)
                    .and_then(|stream| output_type.remote_receiver(local, stream, metrics).map(|_| ()))
            };
            if let Err(error) = result {
                tracing::warn!(edge, producer, consumer, error = %error, "network channel not established");
                if outbound {
                    counted.bridge_done_sending();
                }
            }
        })
        .map(|_| ())
        .map_err(|e| TaskError::external("starting a network channel thread", e))
}

/// Hands a subtask's snapshots to the writer pool, which writes each where its barrier says.
struct SubtaskSnapshotSink {
    vertex: usize,
    subtask: u32,
    ended: Arc<EndedCheckpoints>,
    writer: Sender<WriteJob>,
    /// Incremental checkpoints: what this subtask's next checkpoint may reuse.
    incremental: Option<Arc<IncrementalTracker>>,
}

impl SnapshotSink for SubtaskSnapshotSink {
    fn submit(&self, snapshot: TaskSnapshot) {
        // The checkpoint was aborted meanwhile: its snapshot is not needed.
        if self.ended.has_ended(snapshot.barrier.checkpoint_id) {
            return;
        }
        // Savepoints are always whole and self-contained.
        let incremental = match snapshot.barrier.kind {
            weir_api::snapshot::BarrierKind::Checkpoint { .. } => self.incremental.clone(),
            _ => None,
        };
        let _ = self.writer.send(WriteJob {
            ended: Arc::clone(&self.ended),
            vertex: self.vertex,
            subtask: self.subtask,
            snapshot,
            incremental,
        });
    }

    fn checkpoint_complete(&self, checkpoint_id: u64) {
        if let Some(tracker) = &self.incremental {
            tracker.completed(checkpoint_id);
        }
    }
}

/// What every subtask of one job shares.
#[derive(Clone)]
pub struct JobContext {
    /// The job.
    pub job_id: JobId,
    /// The job's name.
    pub job_name: String,
    /// Set to stop every subtask.
    pub cancel: Arc<AtomicBool>,
    /// Processing time.
    pub clock: Arc<dyn Clock>,
    /// Which run of the job this is (0, then +1 per restart).
    pub attempt: u32,
    /// Which subtasks run in this process.
    pub placement: Placement,
}

/// Creates the channels of `job` and starts one thread per subtask.
///
/// `metrics[v][s]` are the counters of subtask `s` of vertex `v`; events go to `events`.
pub fn deploy<E: From<TaskEvent> + Send + 'static>(
    graph: &Arc<StreamGraph>,
    job: &Arc<JobGraph>,
    job_ctx: &JobContext,
    metrics: &[Vec<Arc<TaskMetrics>>],
    controls: Vec<Vec<Receiver<TaskControl>>>,
    checkpointing: &CheckpointWiring,
    events: &Sender<E>,
) -> Result<Vec<JoinHandle<()>>, TaskError> {
    let placement = &job_ctx.placement;
    let mut controls: Vec<std::vec::IntoIter<Receiver<TaskControl>>> =
        controls.into_iter().map(|v| v.into_iter()).collect();
    let mut channels = Channels::create(graph, job, placement, metrics)?;
    let deployment = Deployment { graph, job, job_ctx, metrics, checkpointing, events };
    let mut handles = Vec::new();
    for (vertex_index, vertex) in job.vertices.iter().enumerate() {
        // Hand each subtask its own channel ends, in subtask order.
        for (subtask, ends) in channels.take_for(job, vertex_index, vertex.parallelism).into_iter().enumerate() {
            // Taken for every subtask so each keeps its own control channel.
            let control = controls.get_mut(vertex_index).and_then(|c| c.next());
            if !(placement.is_local)(vertex_index, subtask as u32) {
                continue;
            }
            handles.push(deployment.spawn_subtask(vertex_index, subtask as u32, control, ends)?);
        }
    }
    Ok(handles)
}

/// One subtask's channel ends: its outputs per edge and its inputs.
struct SubtaskEnds {
    outputs: HashMap<usize, Vec<ErasedChannelEnd>>,
    inputs: Vec<ErasedChannelEnd>,
}

/// The channel ends of every edge of a job, until they are handed to its subtasks.
struct Channels {
    /// `senders[edge][producer subtask]`: one sender per consumer subtask.
    senders: Vec<Vec<Vec<ErasedChannelEnd>>>,
    /// `receivers[edge][consumer subtask]`: one receiver per producer subtask.
    receivers: Vec<Vec<Vec<ErasedChannelEnd>>>,
}

impl Channels {
    /// Creates the channels of every edge of `job`, with a bridge thread for each that
    /// crosses processes.
    /// `metrics` are every subtask's, by vertex and subtask: a bridge counts its bytes there.
    fn create(
        graph: &StreamGraph,
        job: &JobGraph,
        placement: &Placement,
        metrics: &[Vec<Arc<TaskMetrics>>],
    ) -> Result<Channels, TaskError> {
        let mut channels =
            Channels { senders: Vec::with_capacity(job.edges.len()), receivers: Vec::with_capacity(job.edges.len()) };
        for edge in &job.edges {
            let producers = job.vertices[edge.source_vertex].parallelism as usize;
            let consumers = job.vertices[edge.target_vertex].parallelism as usize;
            let output_type = edge_type(graph, edge)?;
            let mut edge_senders: Vec<Vec<ErasedChannelEnd>> =
                (0..producers).map(|_| Vec::with_capacity(consumers)).collect();
            let mut edge_receivers: Vec<Vec<ErasedChannelEnd>> =
                (0..consumers).map(|_| Vec::with_capacity(producers)).collect();
            let edge_index = channels.senders.len();
            for (producer, producer_senders) in edge_senders.iter_mut().enumerate() {
                for (consumer, consumer_receivers) in edge_receivers.iter_mut().enumerate() {
                    let key = (edge_index, edge.target_vertex, producer as u32, consumer as u32);
                    let (sender, receiver) = channel_ends(output_type, (placement, metrics), edge.source_vertex, key)?;
                    producer_senders.push(sender);
                    consumer_receivers.push(receiver);
                }
            }
            channels.senders.push(edge_senders);
            channels.receivers.push(edge_receivers);
        }
        Ok(channels)
    }

    /// Takes the ends of vertex `vertex_index`'s `parallelism` subtasks, in subtask order.
    fn take_for(&mut self, job: &JobGraph, vertex_index: usize, parallelism: u32) -> Vec<SubtaskEnds> {
        let mut per_subtask: Vec<SubtaskEnds> =
            (0..parallelism).map(|_| SubtaskEnds { outputs: HashMap::new(), inputs: Vec::new() }).collect();
        for (edge_index, edge) in job.edges.iter().enumerate() {
            if edge.source_vertex == vertex_index {
                for (subtask, ends) in std::mem::take(&mut self.senders[edge_index]).into_iter().enumerate() {
                    per_subtask[subtask].outputs.insert(edge_index, ends);
                }
            }
            if edge.target_vertex == vertex_index {
                for (subtask, ends) in std::mem::take(&mut self.receivers[edge_index]).into_iter().enumerate() {
                    per_subtask[subtask].inputs.extend(ends);
                }
            }
        }
        per_subtask
    }
}

/// The producer's and the consumer's end of the channel `key` (edge, target vertex, producer,
/// consumer) of an edge from `source_vertex`. When one side runs in another process, the
/// local side's end is bridged over TCP and the other end returned is a dangling one.
fn channel_ends(
    output_type: &Arc<dyn weir_api::graph::StreamType>,
    (placement, metrics): (&Placement, &[Vec<Arc<TaskMetrics>>]),
    source_vertex: usize,
    key: (usize, usize, u32, u32),
) -> Result<(ErasedChannelEnd, ErasedChannelEnd), TaskError> {
    let (_, target_vertex, producer, consumer) = key;
    let (sender, receiver) = output_type.channel();
    let producer_local = (placement.is_local)(source_vertex, producer);
    let consumer_local = (placement.is_local)(target_vertex, consumer);
    Ok(match (producer_local, consumer_local, &placement.network) {
        (true, false, Some(network)) => {
            // The consumer is elsewhere: our producer writes into a local channel
            // whose other end goes out over TCP.
            let counted = subtask_metrics(metrics, source_vertex, producer);
            bridge(Arc::clone(output_type), Arc::clone(network), (receiver, counted), true, key)?;
            (sender, output_type.channel().1)
        }
        (false, true, Some(network)) => {
            let counted = subtask_metrics(metrics, target_vertex, consumer);
            bridge(Arc::clone(output_type), Arc::clone(network), (sender, counted), false, key)?;
            (output_type.channel().0, receiver)
        }
        _ => (sender, receiver),
    })
}

/// The metrics of subtask `subtask` of vertex `vertex`, or fresh ones nobody reads if there
/// are none (a subtask of another process).
fn subtask_metrics(metrics: &[Vec<Arc<TaskMetrics>>], vertex: usize, subtask: u32) -> Arc<TaskMetrics> {
    metrics.get(vertex).and_then(|v| v.get(subtask as usize)).map_or_else(Arc::default, Arc::clone)
}

/// What [`deploy`] starts every subtask with.
struct Deployment<'a, E> {
    graph: &'a Arc<StreamGraph>,
    job: &'a Arc<JobGraph>,
    job_ctx: &'a JobContext,
    metrics: &'a [Vec<Arc<TaskMetrics>>],
    checkpointing: &'a CheckpointWiring,
    events: &'a Sender<E>,
}

impl<E: From<TaskEvent> + Send + 'static> Deployment<'_, E> {
    /// Starts the thread of subtask `subtask` of vertex `vertex_index`.
    fn spawn_subtask(
        &self,
        vertex_index: usize,
        subtask: u32,
        control: Option<Receiver<TaskControl>>,
        ends: SubtaskEnds,
    ) -> Result<JoinHandle<()>, TaskError> {
        let vertex = &self.job.vertices[vertex_index];
        let ctx = self.task_context(vertex_index, subtask, control);
        let wiring = SubtaskWiring {
            graph: Arc::clone(self.graph),
            job: Arc::clone(self.job),
            vertex: vertex_index,
            outputs: ends.outputs,
            inputs: ends.inputs,
            restore: self.checkpointing.restore.clone(),
        };
        let events = self.events.clone();
        let thread_name = format!("weir-task-{}-{subtask}", short_name(&vertex.name));
        std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || run_subtask(wiring, ctx, events))
            .map_err(|e| TaskError::external("starting a subtask thread", e))
    }

    /// The context subtask `subtask` of vertex `vertex_index` runs in.
    fn task_context(&self, vertex_index: usize, subtask: u32, control: Option<Receiver<TaskControl>>) -> TaskContext {
        let (job, job_ctx, checkpointing) = (self.job, self.job_ctx, self.checkpointing);
        let vertex = &job.vertices[vertex_index];
        TaskContext {
            job_id: job_ctx.job_id,
            job_name: job_ctx.job_name.clone(),
            task_name: vertex.name.clone(),
            operator_name: vertex.name.clone(),
            subtask_index: subtask,
            parallelism: vertex.parallelism,
            max_parallelism: job.max_parallelism,
            cancel: Arc::clone(&job_ctx.cancel),
            urgent: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            metrics: Arc::clone(&self.metrics[vertex_index][subtask as usize]),
            clock: Arc::clone(&job_ctx.clock),
            operator_uid: String::new(),
            restored: None,
            control,
            snapshots: Some(Arc::new(SubtaskSnapshotSink {
                vertex: vertex_index,
                subtask,
                ended: Arc::clone(&checkpointing.ended),
                writer: checkpointing.writer.clone(),
                incremental: checkpointing.incremental.map(IncrementalTracker::new),
            })),
            exactly_once: checkpointing.exactly_once,
            spill: checkpointing.spill.clone(),
            incremental: checkpointing.incremental.is_some(),
            attempt: job_ctx.attempt,
            auto_watermark_interval_ms: job.auto_watermark_interval_ms,
            side_outputs: None,
            end_of_data: if checkpointing.final_checkpoint {
                Some(self.end_of_data(vertex_index, subtask))
            } else {
                None
            },
        }
    }

    /// Reports that subtask `subtask` of vertex `vertex_index` reached the end of its input.
    fn end_of_data(&self, vertex_index: usize, subtask: u32) -> Arc<dyn Fn() + Send + Sync> {
        let events = self.events.clone();
        Arc::new(move || {
            let kind = TaskEventKind::EndOfData;
            // A closed channel means the master is gone and nobody listens.
            let _ = events.send(E::from(TaskEvent { vertex: vertex_index, subtask, kind }));
        })
    }
}

fn short_name(name: &str) -> String {
    name.chars().filter(|c| c.is_ascii_alphanumeric()).take(12).collect()
}

struct SubtaskWiring {
    graph: Arc<StreamGraph>,
    job: Arc<JobGraph>,
    vertex: usize,
    outputs: HashMap<usize, Vec<ErasedChannelEnd>>,
    inputs: Vec<ErasedChannelEnd>,
    restore: Option<Arc<RestoreSource>>,
}

fn run_subtask<E: From<TaskEvent>>(wiring: SubtaskWiring, mut ctx: TaskContext, events: Sender<E>) {
    let vertex = wiring.vertex;
    let subtask = ctx.subtask_index;
    let report = |kind: TaskEventKind| {
        // The master outlives its subtasks; a closed channel means it is gone and nobody listens.
        let _ = events.send(E::from(TaskEvent { vertex, subtask, kind }));
    };
    report(TaskEventKind::Initializing);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        if let Some(restore) = &wiring.restore {
            let uids = &wiring.job.vertices[vertex].uids;
            let restored = restore
                .load_subtask(uids, subtask, &ctx.metrics.restored_bytes)
                .map_err(|e| TaskError::external(format!("restoring from {}", restore.location), e))?;
            ctx.restored = Some(Arc::new(restored));
        }
        let mut body = build_body(wiring, &ctx)?;
        report(TaskEventKind::Running);
        run_body(body.as_mut(), &ctx)
    }));
    let kind = match outcome {
        Ok(Ok(())) => TaskEventKind::Finished,
        Ok(Err(TaskError::Cancelled)) => TaskEventKind::Canceled,
        Ok(Err(_)) if ctx.is_cancelled() => TaskEventKind::Canceled,
        Ok(Err(error)) => TaskEventKind::Failed(error),
        Err(panic) => TaskEventKind::Failed(TaskError::user(
            &ctx.task_name,
            format!("user code panicked: {}", panic_message(&panic)),
        )),
    };
    report(kind);
}

fn run_body(body: &mut dyn TaskBody, ctx: &TaskContext) -> Result<(), TaskError> {
    loop {
        if ctx.is_cancelled() {
            return Err(TaskError::Cancelled);
        }
        if body.step()? == Step::Finished {
            return Ok(());
        }
    }
}

/// The text of a panic payload.
pub fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        return (*text).to_string();
    }
    if let Some(text) = panic.downcast_ref::<String>() {
        return text.clone();
    }
    "a panic without a message".to_string()
}

fn build_body(mut wiring: SubtaskWiring, ctx: &TaskContext) -> Result<Box<dyn TaskBody>, TaskError> {
    let graph = Arc::clone(&wiring.graph);
    let job = Arc::clone(&wiring.job);
    let head = job.vertices[wiring.vertex].nodes[0];
    let head_node = &graph.nodes()[head];
    if head_node.role == NodeRole::Source {
        let downstream = build_downstream(&graph, &job, head, &mut wiring.outputs, ctx)?;
        let factory = head_node
            .source_factory()
            .ok_or_else(|| TaskError::Internal(format!("source '{}' has no factory", head_node.name)))?;
        let mut head_ctx = ctx.clone();
        head_ctx.operator_name = head_node.name.clone();
        head_ctx.operator_uid = head_node.uid_or_generated();
        return factory(&head_ctx, downstream);
    }
    let head_operator = build_chained(&graph, &job, head, &mut wiring.outputs, ctx)?;
    let input_type = input_type_of(&graph, head)?;
    // The body records (and restores) an unaligned checkpoint's in-flight records as the
    // chain head's state.
    let mut body_ctx = ctx.clone();
    body_ctx.operator_uid = head_node.uid_or_generated();
    input_type.input_body(std::mem::take(&mut wiring.inputs), head_operator, &body_ctx)
}

/// The type of the records a job edge carries (a side output's, or its source's output).
fn edge_type<'a>(
    graph: &'a StreamGraph,
    edge: &crate::jobgraph::JobEdge,
) -> Result<&'a Arc<dyn weir_api::graph::StreamType>, TaskError> {
    let input = graph.nodes()[edge.target_node]
        .inputs
        .get(edge.input_index)
        .ok_or_else(|| TaskError::Internal(format!("no input {} of node {}", edge.input_index, edge.target_node)))?;
    Ok(graph.edge_type(input))
}

/// The record type entering `node` (the type its first input carries).
fn input_type_of(graph: &StreamGraph, node: usize) -> Result<&Arc<dyn weir_api::graph::StreamType>, TaskError> {
    let input = graph.nodes()[node]
        .inputs
        .first()
        .ok_or_else(|| TaskError::Internal(format!("operator '{}' has no input", graph.nodes()[node].name)))?;
    Ok(graph.edge_type(input))
}

/// `node`'s position in its task's chain: the index of its counters in `TaskMetrics::operators`.
fn chain_index(job: &JobGraph, node: usize) -> usize {
    let vertex = &job.vertices[job.vertex_of_node[node]];
    vertex.nodes.iter().position(|n| *n == node).unwrap_or(usize::MAX)
}

/// The side outputs of `node` that someone reads: per tag, the channel outputs to its
/// readers (side-output edges never chain).
fn build_side_outputs(
    graph: &StreamGraph,
    job: &JobGraph,
    node: usize,
    outputs: &mut HashMap<usize, Vec<ErasedChannelEnd>>,
    ctx: &TaskContext,
) -> Result<Vec<weir_api::side_output::NamedSideLink>, TaskError> {
    let mut by_tag: Vec<(String, Arc<dyn weir_api::graph::StreamType>, Vec<ErasedOperator>)> = Vec::new();
    for (consumer, edge) in graph.consumers(node) {
        let Some(side) = &edge.side else { continue };
        let edge_index =
            job.edges.iter().position(|e| e.source_node == node && e.target_node == consumer).ok_or_else(|| {
                TaskError::Internal(format!("no job edge from node {node} to side output node {consumer}"))
            })?;
        let senders = outputs
            .remove(&edge_index)
            .ok_or_else(|| TaskError::Internal(format!("channels of edge {edge_index} were already taken")))?;
        let link = side.stream_type().channel_output(edge, job.edges[edge_index].forward, senders, ctx)?;
        match by_tag.iter_mut().find(|(tag, _, _)| *tag == side.tag) {
            Some((_, _, links)) => links.push(link),
            None => by_tag.push((side.tag.clone(), Arc::clone(side.stream_type()), vec![link])),
        }
    }
    let mut sides = Vec::with_capacity(by_tag.len());
    for (tag, stream_type, mut links) in by_tag {
        let link = if links.len() == 1 { links.remove(0) } else { stream_type.tee(links)? };
        sides.push((tag, stream_type.side_link(link)?));
    }
    Ok(sides)
}

/// The link that receives `node`'s output: its chained consumers and channel outputs, counted
/// as `node`'s records out.
fn build_downstream(
    graph: &StreamGraph,
    job: &JobGraph,
    node: usize,
    outputs: &mut HashMap<usize, Vec<ErasedChannelEnd>>,
    ctx: &TaskContext,
) -> Result<ErasedOperator, TaskError> {
    let output_type = graph.nodes()[node].output_type();
    let mut links = Vec::new();
    for (consumer, edge) in graph.consumers(node) {
        if edge.side.is_some() {
            continue;
        }
        if job.vertex_of_node[consumer] == job.vertex_of_node[node] {
            links.push(build_chained(graph, job, consumer, outputs, ctx)?);
            continue;
        }
        let edge_index = job
            .edges
            .iter()
            .position(|e| e.source_node == node && e.target_node == consumer)
            .ok_or_else(|| TaskError::Internal(format!("no job edge from node {node} to node {consumer}")))?;
        let senders = outputs
            .remove(&edge_index)
            .ok_or_else(|| TaskError::Internal(format!("channels of edge {edge_index} were already taken")))?;
        links.push(output_type.channel_output(edge, job.edges[edge_index].forward, senders, ctx)?);
    }
    let downstream = match links.len() {
        0 => output_type.discard(),
        1 => links.remove(0),
        _ => output_type.tee(links)?,
    };
    output_type.metered(downstream, Arc::clone(&ctx.metrics), chain_index(job, node))
}

fn build_chained(
    graph: &StreamGraph,
    job: &JobGraph,
    node: usize,
    outputs: &mut HashMap<usize, Vec<ErasedChannelEnd>>,
    ctx: &TaskContext,
) -> Result<ErasedOperator, TaskError> {
    let downstream = build_downstream(graph, job, node, outputs, ctx)?;
    let stream_node = &graph.nodes()[node];
    let factory = stream_node
        .operator_factory()
        .ok_or_else(|| TaskError::Internal(format!("operator '{}' has no factory", stream_node.name)))?;
    let sides = build_side_outputs(graph, job, node, outputs, ctx)?;
    let mut node_ctx = ctx.clone();
    node_ctx.operator_name = stream_node.name.clone();
    node_ctx.operator_uid = stream_node.uid_or_generated();
    let side_links = (!sides.is_empty()).then(|| Arc::new(std::sync::Mutex::new(sides)));
    node_ctx.side_outputs = side_links.clone();
    let operator = factory(&node_ctx, downstream)?;
    if let Some(links) = side_links
        && !links.lock().map(|l| l.is_empty()).unwrap_or(true)
    {
        return Err(TaskError::user(
            &stream_node.name,
            "this operator emits no side outputs: get_side_output(&tag) reads those of a process function or a window",
        ));
    }
    Ok(operator)
}
