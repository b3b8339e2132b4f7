//! The DataStream API: building a job's graph fluently, as in Flink.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

use weir_types::{Key, MAX_PARALLELISM_UPPER_BOUND};

use crate::Data;
use crate::connected::{
    BroadcastAdapter, BroadcastProcessFunction, BroadcastState, CoProcessAdapter, CoProcessFunction, Either,
    KeyedBroadcastAdapter, KeyedBroadcastProcessFunction, KeyedCoProcessAdapter, KeyedCoProcessFunction,
};
use crate::error::TaskError;
use crate::exchange::SourceBody;
use crate::functions::{Collector, KeyedProcessFunction, ProcessFunction};
use crate::graph::{
    EdgeKind, ErasedOperator, GraphError, NodeRole, OperatorFactory, RestoreCheck, SourceFactory, StreamEdge,
    StreamGraph, StreamNode, TypedStream, downcast,
};
use crate::operator::{Operator, TaskContext};
use crate::operators::keyed_process_types::KeySelector;
use crate::operators::{
    FilterOperator, FlatMapOperator, KeyedProcessOperator, MapOperator, ProcessOperator, SinkOperator,
    TimestampsAndWatermarksOperator,
};
use crate::sink::Sink;
use crate::snapshot::{SINK_COMMITTABLES_STATE, SOURCE_POSITIONS_STATE};
use crate::source::Source;
use crate::watermarks::WatermarkStrategy;
use weir_state::handles::StateData;

/// A record's key's stable hash (what a key-partitioned edge routes by).
type KeyHash<T> = Arc<dyn Fn(&T) -> u32 + Send + Sync>;

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
            writes_to_stdout: false,
            restore_check: Some(restore_check),
            source_factory: Some(factory),
            operator_factory: None,
            output_type: TypedStream::<T>::erased(),
        });
        DataStream { builder: Rc::clone(&self.builder), node: id, next_edge: EdgeKind::Auto, _type: PhantomData }
    }

    /// Adds a source whose records get timestamps and watermarks from `strategy` right at the
    /// source (Flink's `env.fromSource(source, watermarkStrategy, name)`). A source whose
    /// readers have splits (a Kafka source's partitions) gets one watermark per split, and
    /// each subtask emits the minimum over its splits that have not ended or gone idle, so
    /// one partition read behind the others does not make its records late. As in Flink, a
    /// split without records holds the watermark back until it is idle: give the strategy
    /// [`with_idleness`](WatermarkStrategy::with_idleness) when partitions may stay empty.
    /// (Per split only while the strategy runs chained to the source, at its parallelism.)
    pub fn from_source_with_watermarks<T: Data, S: Source<T>>(
        &self,
        source: S,
        strategy: WatermarkStrategy<T>,
    ) -> DataStream<T> {
        self.from_source(source).timestamps_and_watermarks(strategy, true)
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
            writes_to_stdout: false,
            restore_check: None,
            source_factory: None,
            operator_factory: Some(factory),
            output_type: TypedStream::<O>::erased(),
        });
        DataStream { builder: Rc::clone(&self.builder), node: id, next_edge: EdgeKind::Auto, _type: PhantomData }
    }

    fn plain_edge(&self) -> StreamEdge {
        StreamEdge { source: self.node, kind: self.next_edge, key_hash: None, side: None }
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

    /// The records the operator producing this stream emitted to side output `tag`
    /// (`out.output(&tag, value)`, or a window's late records).
    pub fn get_side_output<S: Data>(&self, tag: &crate::side_output::OutputTag<S>) -> DataStream<S> {
        let side =
            Arc::new(crate::graph::SideEdge { tag: tag.id().to_string(), stream_type: TypedStream::<S>::erased() });
        let edge = StreamEdge { source: self.node, kind: EdgeKind::Auto, key_hash: None, side: Some(side) };
        self.add_operator(&format!("Side Output '{}'", tag.id()), false, edge, identity_factory::<S>())
    }

    /// One stream of the records of this stream and of `others` (same type), in no particular
    /// order between them (Flink's `union`).
    pub fn union(&self, others: &[DataStream<T>]) -> DataStream<T> {
        let mut edges = vec![self.plain_edge()];
        edges.extend(others.iter().map(DataStream::plain_edge));
        self.add_multi_input("Union", false, edges, identity_factory::<T>())
    }

    /// Both streams, for one function that reads each (`process` with a
    /// [`CoProcessFunction`](crate::connected::CoProcessFunction), or `key_by` first).
    pub fn connect<U: Data>(&self, other: &DataStream<U>) -> ConnectedStreams<T, U> {
        ConnectedStreams { first: self.clone(), second: other.clone() }
    }

    /// This stream as the broadcast side of a broadcast state pattern: every record goes to
    /// every subtask of the operator it is connected to.
    pub fn broadcast(&self) -> BroadcastStream<T> {
        let mut stream = self.clone();
        stream.next_edge = EdgeKind::Broadcast;
        BroadcastStream { stream }
    }

    /// The stream's records as one side of a connected stream.
    /// (Mapped where it is produced: chained, whatever edge the other side asked for.)
    fn tagged<X: Data>(&self, tag: fn(T) -> X) -> DataStream<X> {
        let mut chained = self.clone();
        chained.next_edge = EdgeKind::Auto;
        chained.map(tag)
    }

    fn add_multi_input<O: Data>(
        &self,
        name: &str,
        keyed: bool,
        edges: Vec<StreamEdge>,
        factory: OperatorFactory,
    ) -> DataStream<O> {
        let stream: DataStream<O> = self.add_operator(name, keyed, edges[0].clone(), factory);
        stream.with_node(|node| node.inputs = edges);
        stream
    }

    /// Gives every record an event timestamp and emits watermarks as `strategy` says; the
    /// event-time operators after it (windows, event-time timers) run on them.
    pub fn assign_timestamps_and_watermarks(&self, strategy: WatermarkStrategy<T>) -> DataStream<T> {
        self.timestamps_and_watermarks(strategy, false)
    }

    /// The strategy's operator; `per_split` when the strategy was given to the source.
    fn timestamps_and_watermarks(&self, strategy: WatermarkStrategy<T>, per_split: bool) -> DataStream<T> {
        let factory: OperatorFactory = Arc::new(move |ctx: &TaskContext, downstream: ErasedOperator| {
            let next = downcast::<Box<dyn Operator<T>>>(downstream, "watermark output")?;
            let op: Box<dyn Operator<T>> = Box::new(if per_split {
                TimestampsAndWatermarksOperator::per_split(ctx, &strategy, next)
            } else {
                TimestampsAndWatermarksOperator::new(ctx, &strategy, next)
            });
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
        let to_stdout = sink.writes_to_stdout();
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
            node.writes_to_stdout = to_stdout;
            node.restore_check = Some(restore_check);
        });
        DataStreamSink { stream }
    }
}

/// A link that passes records on unchanged (the operator of a union).
fn identity_factory<T: Data>() -> OperatorFactory {
    Arc::new(move |_ctx: &TaskContext, downstream: ErasedOperator| {
        let next = downcast::<Box<dyn Operator<T>>>(downstream, "union output")?;
        let op: Box<dyn Operator<T>> = Box::new(MapOperator::new(|record: T| record, next));
        Ok(Box::new(op) as ErasedOperator)
    })
}

/// Two streams read by one function (Flink's `ConnectedStreams`).
pub struct ConnectedStreams<A, B> {
    first: DataStream<A>,
    second: DataStream<B>,
}

impl<A: Data, B: Data> ConnectedStreams<A, B> {
    fn tagged_edges(&self) -> (DataStream<Either<A, B>>, Vec<StreamEdge>) {
        let left = self.first.tagged(Either::<A, B>::Left);
        let right = self.second.tagged(Either::<A, B>::Right);
        let mut left_edge = left.plain_edge();
        left_edge.kind = self.first.next_edge;
        let mut right_edge = right.plain_edge();
        right_edge.kind = self.second.next_edge;
        (left, vec![left_edge, right_edge])
    }

    /// Runs `func` over both inputs (non-keyed, with operator state).
    pub fn process<O: Data, F: CoProcessFunction<A, B, O>>(&self, func: F) -> DataStream<O> {
        let (left, edges) = self.tagged_edges();
        let prototype = std::sync::Mutex::new(CoProcessAdapter(func));
        let factory: OperatorFactory = Arc::new(move |ctx: &TaskContext, downstream: ErasedOperator| {
            let next = downcast::<Box<dyn Operator<O>>>(downstream, "co-process output")?;
            let func = match prototype.lock() {
                Ok(prototype) => prototype.clone(),
                Err(poisoned) => poisoned.into_inner().clone(),
            };
            let op: Box<dyn Operator<Either<A, B>>> = Box::new(ProcessOperator::new(ctx, func, next)?);
            Ok(Box::new(op) as ErasedOperator)
        });
        left.add_multi_input("Co-Process", false, edges, factory)
    }

    /// Keys both inputs (by `first_key` and `second_key`, which must give equal keys for
    /// records that belong together): then `process` with a
    /// [`KeyedCoProcessFunction`](crate::connected::KeyedCoProcessFunction).
    pub fn key_by<K: Key>(
        &self,
        first_key: impl Fn(&A) -> K + Send + Sync + 'static,
        second_key: impl Fn(&B) -> K + Send + Sync + 'static,
    ) -> ConnectedKeyedStreams<K, A, B> {
        let selector: KeySelector<Either<A, B>, K> = Arc::new(move |record: &Either<A, B>| match record {
            Either::Left(a) => first_key(a),
            Either::Right(b) => second_key(b),
        });
        ConnectedKeyedStreams {
            streams: ConnectedStreams { first: self.first.clone(), second: self.second.clone() },
            selector,
        }
    }
}

/// Two keyed streams read by one keyed function.
pub struct ConnectedKeyedStreams<K, A, B> {
    streams: ConnectedStreams<A, B>,
    selector: KeySelector<Either<A, B>, K>,
}

impl<K: Key, A: Data, B: Data> ConnectedKeyedStreams<K, A, B> {
    /// Runs `func` with the record's key as the current key, for records of either input.
    pub fn process<O: Data, F: KeyedCoProcessFunction<K, A, B, O>>(&self, func: F) -> DataStream<O> {
        self.process_keyed("Keyed Co-Process", KeyedCoProcessAdapter(func), EdgeKind::Hash, None)
    }

    /// Both inputs hash-partitioned by key into one keyed operator running `func`; the
    /// second input's edge is `second_edge` (`Broadcast` for the broadcast side); `invalid`
    /// fails every subtask at start with that message.
    pub(crate) fn process_keyed<O: Data, F: KeyedProcessFunction<K, Either<A, B>, O>>(
        &self,
        name: &str,
        func: F,
        second_edge: EdgeKind,
        invalid: Option<String>,
    ) -> DataStream<O> {
        let (left, mut edges) = self.streams.tagged_edges();
        let hash_selector = Arc::clone(&self.selector);
        let key_hash: KeyHash<Either<A, B>> =
            Arc::new(move |record: &Either<A, B>| hash_selector(record).stable_hash());
        edges[0].kind = EdgeKind::Hash;
        edges[0].key_hash = Some(Arc::new(Arc::clone(&key_hash)));
        edges[1].kind = second_edge;
        if second_edge == EdgeKind::Hash {
            edges[1].key_hash = Some(Arc::new(key_hash));
        }
        let keyed = KeyedStream {
            stream: left,
            selector: Arc::clone(&self.selector),
            key_hash: Arc::new(|_: &Either<A, B>| 0),
        };
        let stream = keyed.process_named(name, func, invalid);
        stream.with_node(|node| node.inputs = edges);
        stream
    }
}

/// A stream whose records go to every subtask (see [`DataStream::broadcast`]).
pub struct BroadcastStream<T> {
    stream: DataStream<T>,
}

impl<T: Data> DataStream<T> {
    /// Connects this stream with a broadcast stream: then `process` with a
    /// [`BroadcastProcessFunction`](crate::connected::BroadcastProcessFunction) and the
    /// broadcast state's name.
    pub fn connect_broadcast<B: Data>(&self, broadcast: &BroadcastStream<B>) -> BroadcastConnectedStream<T, B> {
        BroadcastConnectedStream { streams: self.connect(&broadcast.stream) }
    }
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Connects this keyed stream with another one keyed alike (Flink's
    /// `keyedStream.connect(keyedStream)`).
    pub fn connect<U: Data>(&self, other: &KeyedStream<K, U>) -> ConnectedKeyedStreams<K, T, U> {
        let (first, second) = (Arc::clone(&self.selector), Arc::clone(&other.selector));
        self.stream.connect(&other.stream).key_by(move |a: &T| first(a), move |b: &U| second(b))
    }

    /// Connects this keyed stream with a broadcast stream: then `process` with a
    /// [`KeyedBroadcastProcessFunction`](crate::connected::KeyedBroadcastProcessFunction).
    pub fn connect_broadcast<B: Data>(&self, broadcast: &BroadcastStream<B>) -> KeyedBroadcastConnectedStream<K, T, B> {
        let first = Arc::clone(&self.selector);
        let selector: KeySelector<Either<T, B>, K> = Arc::new(move |record: &Either<T, B>| match record {
            Either::Left(a) => first(a),
            // Never called: broadcast records are not keyed (`is_keyed`).
            Either::Right(_) => unreachable_key(),
        });
        KeyedBroadcastConnectedStream {
            streams: ConnectedKeyedStreams { streams: self.stream.connect(&broadcast.stream), selector },
        }
    }
}

/// The key of a broadcast record, which has none; the keyed broadcast operator never asks.
fn unreachable_key<K>() -> K {
    panic!("the broadcast side of a keyed broadcast function has no key")
}

/// A stream connected with a broadcast stream.
pub struct BroadcastConnectedStream<A, B> {
    streams: ConnectedStreams<A, B>,
}

impl<A: Data, B: Data> BroadcastConnectedStream<A, B> {
    /// Runs `func` with the broadcast state `state_name` (the same in every subtask).
    pub fn process<BK: StateData + Ord, BV: StateData, O: Data, F>(
        &self,
        state_name: &'static str,
        func: F,
    ) -> DataStream<O>
    where
        F: BroadcastProcessFunction<A, B, BK, BV, O>,
    {
        let (left, edges) = self.streams.tagged_edges();
        let prototype =
            std::sync::Mutex::new(BroadcastAdapter { function: func, state: BroadcastState::new(state_name) });
        let factory: OperatorFactory = Arc::new(move |ctx: &TaskContext, downstream: ErasedOperator| {
            let next = downcast::<Box<dyn Operator<O>>>(downstream, "broadcast process output")?;
            let func = match prototype.lock() {
                Ok(prototype) => prototype.clone(),
                Err(poisoned) => poisoned.into_inner().clone(),
            };
            let op: Box<dyn Operator<Either<A, B>>> = Box::new(ProcessOperator::new(ctx, func, next)?);
            Ok(Box::new(op) as ErasedOperator)
        });
        left.add_multi_input("Broadcast-Process", false, edges, factory)
    }
}

/// A keyed stream connected with a broadcast stream.
pub struct KeyedBroadcastConnectedStream<K, A, B> {
    streams: ConnectedKeyedStreams<K, A, B>,
}

impl<K: Key, A: Data, B: Data> KeyedBroadcastConnectedStream<K, A, B> {
    /// Runs `func` with the keyed side's key as the current key and the broadcast state
    /// `state_name`.
    pub fn process<BK: StateData + Ord, BV: StateData, O: Data, F>(
        &self,
        state_name: &'static str,
        func: F,
    ) -> DataStream<O>
    where
        F: KeyedBroadcastProcessFunction<K, A, B, BK, BV, O>,
    {
        let adapter = KeyedBroadcastAdapter { function: func, state: BroadcastState::new(state_name) };
        self.streams.process_keyed("Keyed Broadcast-Process", adapter, EdgeKind::Broadcast, None)
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
        crate::windows::WindowedStream { keyed: self.clone(), assigner, allowed_lateness: 0, late_tag: None }
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
        let edge = StreamEdge {
            source: self.stream.node,
            kind: EdgeKind::Hash,
            key_hash: Some(Arc::new(key_hash)),
            side: None,
        };
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
