//! The DataStream API: building a job's graph fluently, as in Flink.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

use weir_types::{Key, MAX_PARALLELISM_UPPER_BOUND};

use crate::Data;
use crate::error::TaskError;
use crate::exchange::SourceBody;
use crate::functions::{Collector, KeyedProcessFunction, ProcessFunction};
use crate::graph::{
    EdgeKind, ErasedOperator, GraphError, NodeRole, OperatorFactory, RestoreCheck, SourceFactory, StreamEdge,
    StreamGraph, StreamNode, TypedStream, downcast,
};
use crate::operator::{Operator, TaskContext};
use crate::operators::{
    FilterOperator, FlatMapOperator, KeyedProcessOperator, MapOperator, ProcessOperator, SinkOperator,
    TimestampsAndWatermarksOperator,
};
use crate::sink::Sink;
use crate::snapshot::{SINK_COMMITTABLES_STATE, SOURCE_POSITIONS_STATE};
use crate::source::Source;
use crate::watermarks::WatermarkStrategy;

struct Builder {
    nodes: Vec<StreamNode>,
    max_parallelism: Option<u32>,
    parallelism: Option<u32>,
}

/// Where a job is assembled: add sources, transform, sink, then [`build`](Self::build).
pub struct StreamExecutionEnvironment {
    builder: Rc<RefCell<Builder>>,
}

impl Default for StreamExecutionEnvironment {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamExecutionEnvironment {
    /// An empty environment.
    pub fn new() -> StreamExecutionEnvironment {
        let builder = Builder { nodes: Vec::new(), max_parallelism: None, parallelism: None };
        StreamExecutionEnvironment { builder: Rc::new(RefCell::new(builder)) }
    }

    /// The default parallelism of operators without their own (overrides `parallelism.default`).
    pub fn set_parallelism(&self, parallelism: u32) -> &Self {
        self.builder.borrow_mut().parallelism = Some(parallelism);
        self
    }

    /// The job's max parallelism: its number of key groups, fixed at first start
    /// (overrides `pipeline.max-parallelism`).
    pub fn set_max_parallelism(&self, max_parallelism: u32) -> &Self {
        self.builder.borrow_mut().max_parallelism = Some(max_parallelism);
        self
    }

    /// Adds a source.
    pub fn from_source<T: Data, S: Source<T>>(&self, source: S) -> DataStream<T> {
        let source = Arc::new(source);
        let checked = Arc::clone(&source);
        let restore_check = RestoreCheck {
            state: SOURCE_POSITIONS_STATE,
            check: Arc::new(move |positions: &[Vec<u8>]| checked.check_restore(positions)),
        };
        let factory: SourceFactory = Arc::new(move |ctx: &TaskContext, downstream: ErasedOperator| {
            let head = downcast::<Box<dyn Operator<T>>>(downstream, "source output")?;
            // Absent from the snapshot (a new source, or a changed uid): read from the start.
            let reader = match ctx.restored_operator() {
                Some(restored) => {
                    let positions = restored.operator_states.get(SOURCE_POSITIONS_STATE).cloned().unwrap_or_default();
                    source.restore_reader(ctx, positions)?
                }
                None => source.create_reader(ctx)?,
            };
            let mut body = SourceBody::new(reader, head, ctx);
            if crate::snapshot::RestoredOperator::is_finished(ctx.restored_operator()) {
                body.finished_on_restore();
            }
            Ok(Box::new(body) as Box<dyn crate::operator::TaskBody>)
        });
        let id = self.add_node(StreamNode {
            id: 0,
            name: "Custom Source".into(),
            uid: None,
            parallelism: None,
            role: NodeRole::Source,
            keyed: false,
            key_type: None,
            declared_states: Vec::new(),
            inputs: Vec::new(),
            exclusive_target: None,
            restore_check: Some(restore_check),
            source_factory: Some(factory),
            operator_factory: None,
            output_type: TypedStream::<T>::erased(),
        });
        DataStream { builder: Rc::clone(&self.builder), node: id, next_edge: EdgeKind::Auto, _type: PhantomData }
    }

    /// Adds a source whose records get timestamps and watermarks from `strategy` right at the
    /// source (Flink's `env.fromSource(source, watermarkStrategy, name)`).
    pub fn from_source_with_watermarks<T: Data, S: Source<T>>(
        &self,
        source: S,
        strategy: WatermarkStrategy<T>,
    ) -> DataStream<T> {
        self.from_source(source).assign_timestamps_and_watermarks(strategy)
    }

    fn add_node(&self, mut node: StreamNode) -> usize {
        let mut builder = self.builder.borrow_mut();
        node.id = builder.nodes.len();
        builder.nodes.push(node);
        builder.nodes.len() - 1
    }

    /// Validates and returns the graph.
    pub fn build(&self, job_name: &str) -> Result<StreamGraph, GraphError> {
        let mut builder = self.builder.borrow_mut();
        if !builder.nodes.iter().any(|n| n.role == NodeRole::Source) {
            return Err(GraphError::NoSource);
        }
        if let Some(max) = builder.max_parallelism
            && (max == 0 || max > MAX_PARALLELISM_UPPER_BOUND)
        {
            return Err(GraphError::BadMaxParallelism(max));
        }
        let mut seen = std::collections::HashSet::new();
        for node in &builder.nodes {
            if let Some(uid) = &node.uid
                && !seen.insert(uid.clone())
            {
                return Err(GraphError::DuplicateUid(uid.clone()));
            }
            if let Some(p) = node.parallelism
                && (p == 0 || p > MAX_PARALLELISM_UPPER_BOUND)
            {
                return Err(GraphError::BadParallelism { name: node.name.clone(), parallelism: p });
            }
        }
        let mut targets: std::collections::HashMap<&str, &StreamNode> = std::collections::HashMap::new();
        for node in &builder.nodes {
            let Some(target) = node.exclusive_target.as_deref() else { continue };
            if let Some(first) = targets.insert(target, node) {
                let label = |n: &StreamNode| n.uid.clone().unwrap_or_else(|| n.name.clone());
                return Err(GraphError::SharedSinkTarget {
                    first: label(first),
                    second: label(node),
                    target: target.to_string(),
                });
            }
        }
        Ok(StreamGraph {
            job_name: job_name.to_string(),
            max_parallelism: builder.max_parallelism,
            parallelism: builder.parallelism,
            nodes: std::mem::take(&mut builder.nodes),
        })
    }
}

/// A stream of `T` records: the output of one node.
pub struct DataStream<T> {
    builder: Rc<RefCell<Builder>>,
    node: usize,
    next_edge: EdgeKind,
    _type: PhantomData<fn() -> T>,
}

impl<T> Clone for DataStream<T> {
    fn clone(&self) -> Self {
        DataStream { builder: Rc::clone(&self.builder), node: self.node, next_edge: self.next_edge, _type: PhantomData }
    }
}

impl<T: Data> DataStream<T> {
    fn with_node(&self, f: impl FnOnce(&mut StreamNode)) {
        let mut builder = self.builder.borrow_mut();
        f(&mut builder.nodes[self.node]);
    }

    /// Sets the uid of the operator that produces this stream (state is matched by it).
    pub fn uid(self, uid: &str) -> Self {
        self.with_node(|node| node.uid = Some(uid.to_string()));
        self
    }

    /// Sets the display name of the operator that produces this stream.
    pub fn name(self, name: &str) -> Self {
        self.with_node(|node| node.name = name.to_string());
        self
    }

    /// Sets the parallelism of the operator that produces this stream.
    pub fn parallelism(self, parallelism: u32) -> Self {
        self.with_node(|node| node.parallelism = Some(parallelism));
        self
    }

    /// Distributes the next operator's input round-robin instead of forward.
    pub fn rebalance(mut self) -> Self {
        self.next_edge = EdgeKind::Rebalance;
        self
    }

    fn add_operator<O: Data>(
        &self,
        name: &str,
        keyed: bool,
        edge: StreamEdge,
        factory: OperatorFactory,
    ) -> DataStream<O> {
        let mut builder = self.builder.borrow_mut();
        let id = builder.nodes.len();
        builder.nodes.push(StreamNode {
            id,
            name: name.to_string(),
            uid: None,
            parallelism: None,
            role: NodeRole::Operator,
            keyed,
            key_type: None,
            declared_states: Vec::new(),
            inputs: vec![edge],
            exclusive_target: None,
            restore_check: None,
            source_factory: None,
            operator_factory: Some(factory),
            output_type: TypedStream::<O>::erased(),
        });
        DataStream { builder: Rc::clone(&self.builder), node: id, next_edge: EdgeKind::Auto, _type: PhantomData }
    }

    fn plain_edge(&self) -> StreamEdge {
        StreamEdge { source: self.node, kind: self.next_edge, key_hash: None }
    }

    /// Applies `func` to every record.
    pub fn map<O: Data, F>(&self, func: F) -> DataStream<O>
    where
        F: FnMut(T) -> O + Clone + Send + Sync + 'static,
    {
        let factory: OperatorFactory = Arc::new(move |_ctx: &TaskContext, downstream: ErasedOperator| {
            let next = downcast::<Box<dyn Operator<O>>>(downstream, "map output")?;
            let op: Box<dyn Operator<T>> = Box::new(MapOperator::new(func.clone(), next));
            Ok(Box::new(op) as ErasedOperator)
        });
        self.add_operator("Map", false, self.plain_edge(), factory)
    }

    /// Keeps the records for which `func` is true.
    pub fn filter<F>(&self, func: F) -> DataStream<T>
    where
        F: FnMut(&T) -> bool + Clone + Send + Sync + 'static,
    {
        let factory: OperatorFactory = Arc::new(move |_ctx: &TaskContext, downstream: ErasedOperator| {
            let next = downcast::<Box<dyn Operator<T>>>(downstream, "filter output")?;
            let op: Box<dyn Operator<T>> = Box::new(FilterOperator::new(func.clone(), next));
            Ok(Box::new(op) as ErasedOperator)
        });
        self.add_operator("Filter", false, self.plain_edge(), factory)
    }

    /// Emits zero or more records per record through the collector.
    pub fn flat_map<O: Data, F>(&self, func: F) -> DataStream<O>
    where
        F: FnMut(T, &mut Collector<'_, O>) + Clone + Send + Sync + 'static,
    {
        let factory: OperatorFactory = Arc::new(move |_ctx: &TaskContext, downstream: ErasedOperator| {
            let next = downcast::<Box<dyn Operator<O>>>(downstream, "flat_map output")?;
            let op: Box<dyn Operator<T>> = Box::new(FlatMapOperator::new(func.clone(), next));
            Ok(Box::new(op) as ErasedOperator)
        });
        self.add_operator("Flat Map", false, self.plain_edge(), factory)
    }

    /// Runs a non-keyed function with operator state (list, union list, broadcast) over the
    /// stream; give it a `.uid()` so its state can be restored.
    pub fn process<O: Data, F>(&self, func: F) -> DataStream<O>
    where
        F: ProcessFunction<T, O>,
    {
        // Functions are cloned per subtask; the prototype is only ever cloned.
        let prototype = std::sync::Mutex::new(func);
        let factory: OperatorFactory = Arc::new(move |ctx: &TaskContext, downstream: ErasedOperator| {
            let next = downcast::<Box<dyn Operator<O>>>(downstream, "process output")?;
            let func = match prototype.lock() {
                Ok(prototype) => prototype.clone(),
                Err(poisoned) => poisoned.into_inner().clone(),
            };
            let op: Box<dyn Operator<T>> = Box::new(ProcessOperator::new(ctx, func, next)?);
            Ok(Box::new(op) as ErasedOperator)
        });
        self.add_operator("Process", false, self.plain_edge(), factory)
    }

    /// Gives every record an event timestamp and emits watermarks as `strategy` says; the
    /// event-time operators after it (windows, event-time timers) run on them.
    pub fn assign_timestamps_and_watermarks(&self, strategy: WatermarkStrategy<T>) -> DataStream<T> {
        let factory: OperatorFactory = Arc::new(move |ctx: &TaskContext, downstream: ErasedOperator| {
            let next = downcast::<Box<dyn Operator<T>>>(downstream, "watermark output")?;
            let op: Box<dyn Operator<T>> = Box::new(TimestampsAndWatermarksOperator::new(ctx, &strategy, next));
            Ok(Box::new(op) as ErasedOperator)
        });
        self.add_operator("Timestamps/Watermarks", false, self.plain_edge(), factory)
    }

    /// Partitions the stream by key: records with equal keys go to the same subtask, where
    /// keyed state is scoped to the key.
    pub fn key_by<K: Key, F>(&self, selector: F) -> KeyedStream<K, T>
    where
        F: Fn(&T) -> K + Send + Sync + 'static,
    {
        let selector = Arc::new(selector);
        let hash_selector = Arc::clone(&selector);
        let key_hash: Arc<dyn Fn(&T) -> u32 + Send + Sync> =
            Arc::new(move |record: &T| hash_selector(record).stable_hash());
        KeyedStream { stream: self.clone(), selector, key_hash }
    }

    /// As [`key_by`](Self::key_by), with a selector that borrows the key from the record:
    /// routing then hashes the key without copying it (cheaper for string keys).
    ///
    /// ```
    /// # use weir_api::prelude::*;
    /// let env = StreamExecutionEnvironment::new();
    /// let words = env.from_source(VecSource::new(vec!["a".to_string()]));
    /// let _keyed = words.key_by_ref(|word: &String| word);
    /// ```
    pub fn key_by_ref<K: Key, F>(&self, selector: F) -> KeyedStream<K, T>
    where
        F: for<'a> Fn(&'a T) -> &'a K + Send + Sync + 'static,
    {
        let selector = Arc::new(selector);
        let hash_selector = Arc::clone(&selector);
        let key_hash: Arc<dyn Fn(&T) -> u32 + Send + Sync> =
            Arc::new(move |record: &T| hash_selector(record).stable_hash());
        let owned: Arc<dyn Fn(&T) -> K + Send + Sync> = Arc::new(move |record: &T| selector(record).clone());
        KeyedStream { stream: self.clone(), selector: owned, key_hash }
    }

    /// Writes the stream to `sink`.
    pub fn sink_to<S: Sink<T>>(&self, sink: S) -> DataStreamSink {
        let target = sink.exclusive_target();
        let sink = Arc::new(sink);
        let checked = Arc::clone(&sink);
        let restore_check = RestoreCheck {
            state: SINK_COMMITTABLES_STATE,
            check: Arc::new(move |committables: &[Vec<u8>]| checked.check_restore(committables)),
        };
        let factory: OperatorFactory = Arc::new(move |ctx: &TaskContext, _downstream: ErasedOperator| {
            let writer = match ctx.restored_operator() {
                Some(restored) => {
                    let committables =
                        restored.operator_states.get(SINK_COMMITTABLES_STATE).cloned().unwrap_or_default();
                    sink.restore_writer(ctx, committables)?
                }
                None => sink.create_writer(ctx)?,
            };
            let op: Box<dyn Operator<T>> =
                Box::new(SinkOperator::new(writer, Arc::clone(&ctx.metrics), &ctx.operator_uid));
            Ok(Box::new(op) as ErasedOperator)
        });
        let stream: DataStream<()> = self.add_operator("Unnamed", false, self.plain_edge(), factory);
        stream.with_node(|node| {
            node.role = NodeRole::Sink;
            node.exclusive_target = target;
            node.restore_check = Some(restore_check);
        });
        DataStreamSink { stream }
    }
}

/// The handle of a sink, for setting its uid, name and parallelism.
pub struct DataStreamSink {
    stream: DataStream<()>,
}

impl DataStreamSink {
    /// Sets the sink's uid.
    pub fn uid(self, uid: &str) -> Self {
        DataStreamSink { stream: self.stream.uid(uid) }
    }

    /// Sets the sink's display name.
    pub fn name(self, name: &str) -> Self {
        DataStreamSink { stream: self.stream.name(name) }
    }

    /// Sets the sink's parallelism.
    pub fn parallelism(self, parallelism: u32) -> Self {
        DataStreamSink { stream: self.stream.parallelism(parallelism) }
    }
}

/// A stream partitioned by key.
#[derive(Clone)]
pub struct KeyedStream<K, T> {
    stream: DataStream<T>,
    selector: Arc<dyn Fn(&T) -> K + Send + Sync>,
    /// The key's stable hash, computed the cheapest way the selector allows.
    key_hash: Arc<dyn Fn(&T) -> u32 + Send + Sync>,
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Cuts the stream into the windows `assigner` gives each record
    /// ([`TumblingEventTimeWindows`](crate::windows::TumblingEventTimeWindows) and the others).
    pub fn window(&self, assigner: crate::windows::WindowAssigner) -> crate::windows::WindowedStream<K, T> {
        crate::windows::WindowedStream { keyed: self.clone(), assigner, allowed_lateness: 0 }
    }

    /// Windows of `count` records per key, each fired and purged when full (Flink's
    /// `countWindow`).
    pub fn count_window(&self, count: u64) -> crate::windows::WindowedStream<K, T> {
        self.window(crate::windows::WindowAssigner::Count { count })
    }

    /// Runs `func` for every record with the record's key as the current key.
    pub fn process<O: Data, F>(&self, func: F) -> DataStream<O>
    where
        F: KeyedProcessFunction<K, T, O>,
    {
        self.process_named("KeyedProcess", func, None)
    }

    /// As [`process`](Self::process) under the operator name `name`; `invalid` makes every
    /// subtask fail at start with that message (a window's bad size, say).
    pub(crate) fn process_named<O: Data, F>(&self, name: &str, func: F, invalid: Option<String>) -> DataStream<O>
    where
        F: KeyedProcessFunction<K, T, O>,
    {
        let selector = Arc::clone(&self.selector);
        // Functions may hold !Sync state handles; the prototype is only ever cloned.
        let declared_states = func.states();
        let prototype = std::sync::Mutex::new(func);
        let key_hash = Arc::clone(&self.key_hash);
        let edge = StreamEdge { source: self.stream.node, kind: EdgeKind::Hash, key_hash: Some(Arc::new(key_hash)) };
        let factory: OperatorFactory = Arc::new(move |ctx: &TaskContext, downstream: ErasedOperator| {
            let next = downcast::<Box<dyn Operator<O>>>(downstream, "process output")?;
            if let Some(invalid) = &invalid {
                return Err(TaskError::user(&ctx.operator_name, invalid));
            }
            if ctx.parallelism == 0 || ctx.parallelism > ctx.max_parallelism {
                return Err(TaskError::Internal(format!(
                    "parallelism {} is not within 1..={} (max parallelism)",
                    ctx.parallelism, ctx.max_parallelism
                )));
            }
            let func = match prototype.lock() {
                Ok(prototype) => prototype.clone(),
                Err(poisoned) => poisoned.into_inner().clone(),
            };
            let mut operator = KeyedProcessOperator::new(ctx, func, Arc::clone(&selector), next);
            if let Some(restored) = ctx.restored_operator() {
                operator.restore(restored)?;
            }
            operator.declare_states()?;
            let op: Box<dyn Operator<T>> = Box::new(operator);
            Ok(Box::new(op) as ErasedOperator)
        });
        let stream = self.stream.add_operator(name, true, edge, factory);
        stream.with_node(|node| {
            node.key_type = Some(std::any::type_name::<K>());
            node.declared_states = declared_states;
        });
        stream
    }
}
