//! Small sources and sinks for examples and tests: a source over a vector, a sink that
//! collects into shared memory.

use std::sync::{Arc, Mutex};

use crate::Data;
use crate::error::TaskError;
use crate::operator::TaskContext;
use crate::sink::{Sink, SinkWriter};
use crate::snapshot::Redistribution;
use crate::source::{Boundedness, Source, SourcePoll, SourcePositions, SourceReader};

/// A bounded source over a fixed vector; subtask i of p reads elements i, i+p, i+2p ...
#[derive(Clone)]
pub struct VecSource<T> {
    items: Arc<Vec<T>>,
}

impl<T> VecSource<T> {
    /// A source of `items`.
    pub fn new(items: Vec<T>) -> Self {
        VecSource { items: Arc::new(items) }
    }
}

impl<T: Data + Sync> Source<T> for VecSource<T> {
    fn boundedness(&self) -> Boundedness {
        Boundedness::Bounded
    }

    fn create_reader(&self, ctx: &TaskContext) -> Result<Box<dyn SourceReader<T>>, TaskError> {
        let cursor = Cursor { next: ctx.subtask_index as u64, stride: ctx.parallelism.max(1) as u64 };
        Ok(Box::new(VecReader { items: Arc::clone(&self.items), cursors: vec![cursor] }))
    }

    fn restore_reader(
        &self,
        _ctx: &TaskContext,
        positions: Vec<Vec<u8>>,
    ) -> Result<Box<dyn SourceReader<T>>, TaskError> {
        let mut cursors = Vec::with_capacity(positions.len());
        for bytes in positions {
            let (next, stride): (u64, u64) =
                postcard::from_bytes(&bytes).map_err(|e| TaskError::external("restoring a vector source", e))?;
            cursors.push(Cursor { next, stride: stride.max(1) });
        }
        Ok(Box::new(VecReader { items: Arc::clone(&self.items), cursors }))
    }
}

/// One strided walk over the vector; rescaling moves whole cursors between subtasks.
#[derive(Clone, Copy)]
struct Cursor {
    next: u64,
    stride: u64,
}

struct VecReader<T> {
    items: Arc<Vec<T>>,
    cursors: Vec<Cursor>,
}

impl<T: Data + Sync> SourceReader<T> for VecReader<T> {
    fn poll_next(&mut self, out: &mut Vec<T>, max_records: usize) -> Result<SourcePoll, TaskError> {
        let len = self.items.len() as u64;
        let Some(cursor) = self.cursors.iter_mut().find(|c| c.next < len) else {
            return Ok(SourcePoll::End);
        };
        while cursor.next < len && out.len() < max_records {
            out.push(self.items[cursor.next as usize].clone());
            cursor.next += cursor.stride;
        }
        Ok(SourcePoll::Data)
    }

    fn snapshot_positions(&self) -> SourcePositions {
        let mut elements = Vec::with_capacity(self.cursors.len());
        for cursor in &self.cursors {
            elements.push(postcard::to_allocvec(&(cursor.next, cursor.stride)).unwrap_or_default());
        }
        SourcePositions { mode: Redistribution::Split, elements }
    }
}

/// A sink collecting every record into memory shared with the test.
#[derive(Clone)]
pub struct CollectSink<T> {
    records: Arc<Mutex<Vec<T>>>,
}

impl<T> Default for CollectSink<T> {
    fn default() -> Self {
        CollectSink { records: Arc::new(Mutex::new(Vec::new())) }
    }
}

impl<T: Clone> CollectSink<T> {
    /// Everything collected so far.
    pub fn records(&self) -> Vec<T> {
        match self.records.lock() {
            Ok(records) => records.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

impl<T: Data> Sink<T> for CollectSink<T> {
    fn create_writer(&self, _ctx: &TaskContext) -> Result<Box<dyn SinkWriter<T>>, TaskError> {
        Ok(Box::new(CollectWriter { records: Arc::clone(&self.records) }))
    }
}

struct CollectWriter<T> {
    records: Arc<Mutex<Vec<T>>>,
}

impl<T: Send> SinkWriter<T> for CollectWriter<T> {
    fn write_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError> {
        let mut records = self.records.lock().map_err(|_| TaskError::Internal("collect sink lock poisoned".into()))?;
        records.append(batch);
        Ok(())
    }
}

/// An unbounded source of 0, 1, 2, ... per subtask, optionally paced: for tests that need a
/// job that runs until it is cancelled or stopped. Its position restores.
#[derive(Clone, Debug, Default)]
pub struct EndlessSource {
    batch_max: Option<usize>,
    pause: std::time::Duration,
}

impl EndlessSource {
    /// As fast as possible.
    pub fn new() -> EndlessSource {
        EndlessSource::default()
    }

    /// At most `batch_max` records per poll, with `pause` after each poll.
    pub fn paced(batch_max: usize, pause: std::time::Duration) -> EndlessSource {
        EndlessSource { batch_max: Some(batch_max), pause }
    }
}

impl Source<u64> for EndlessSource {
    fn boundedness(&self) -> Boundedness {
        Boundedness::Unbounded
    }

    fn create_reader(&self, _ctx: &TaskContext) -> Result<Box<dyn SourceReader<u64>>, TaskError> {
        Ok(Box::new(EndlessReader { next: 0, source: self.clone() }))
    }

    fn restore_reader(
        &self,
        _ctx: &TaskContext,
        positions: Vec<Vec<u8>>,
    ) -> Result<Box<dyn SourceReader<u64>>, TaskError> {
        let mut next = 0;
        for bytes in positions {
            let position: u64 =
                postcard::from_bytes(&bytes).map_err(|e| TaskError::external("restoring an endless source", e))?;
            next = next.max(position);
        }
        Ok(Box::new(EndlessReader { next, source: self.clone() }))
    }
}

struct EndlessReader {
    next: u64,
    source: EndlessSource,
}

impl SourceReader<u64> for EndlessReader {
    fn poll_next(&mut self, out: &mut Vec<u64>, max_records: usize) -> Result<SourcePoll, TaskError> {
        let count = self.source.batch_max.map_or(max_records, |batch| batch.min(max_records));
        for _ in 0..count {
            out.push(self.next);
            self.next += 1;
        }
        if !self.source.pause.is_zero() {
            std::thread::sleep(self.source.pause);
        }
        Ok(SourcePoll::Data)
    }

    fn snapshot_positions(&self) -> SourcePositions {
        SourcePositions {
            mode: Redistribution::Split,
            elements: vec![postcard::to_allocvec(&self.next).unwrap_or_default()],
        }
    }
}

/// A keyed running count for tests: for every `u64` record keyed by itself, emits
/// `(key, count of that key so far)` from a value state named `count`.
#[derive(Clone)]
pub struct RunningCount {
    count: weir_state::ValueState<u64>,
}

impl Default for RunningCount {
    fn default() -> Self {
        RunningCount { count: weir_state::ValueState::new("count") }
    }
}

impl crate::functions::KeyedProcessFunction<u64, u64, (u64, u64)> for RunningCount {
    fn states(&self) -> Vec<weir_state::StateDeclaration> {
        vec![self.count.declaration()]
    }

    fn process_element(
        &mut self,
        key: u64,
        ctx: &mut crate::functions::KeyedContext<'_, u64>,
        out: &mut crate::functions::Collector<'_, (u64, u64)>,
    ) -> crate::functions::FnResult {
        let mut count = ctx.value(&self.count)?;
        let n = count.get_or_insert_with(|| 0);
        *n += 1;
        out.collect((key, *n));
        Ok(())
    }
}

/// A keyed pass-through for tests that fails with `refusing record N` on the record equal to
/// its value (`FailOn(u64::MAX)` never fails).
#[derive(Clone)]
pub struct FailOn(pub u64);

impl crate::functions::KeyedProcessFunction<u64, u64, u64> for FailOn {
    fn process_element(
        &mut self,
        value: u64,
        _ctx: &mut crate::functions::KeyedContext<'_, u64>,
        out: &mut crate::functions::Collector<'_, u64>,
    ) -> crate::functions::FnResult {
        if value == self.0 {
            return Err(format!("refusing record {value}").into());
        }
        out.collect(value);
        Ok(())
    }
}
