//! Small sources and sinks for examples and tests: a source over a vector, a sink that
//! collects into shared memory.

use std::sync::{Arc, Mutex};

use crate::Data;
use crate::error::TaskError;
use crate::operator::TaskContext;
use crate::sink::{Sink, SinkWriter};
use crate::source::{Boundedness, Source, SourcePoll, SourceReader};

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
        Ok(Box::new(VecReader {
            items: Arc::clone(&self.items),
            next: ctx.subtask_index as usize,
            stride: ctx.parallelism.max(1) as usize,
        }))
    }
}

struct VecReader<T> {
    items: Arc<Vec<T>>,
    next: usize,
    stride: usize,
}

impl<T: Data + Sync> SourceReader<T> for VecReader<T> {
    fn poll_next(&mut self, out: &mut Vec<T>, max_records: usize) -> Result<SourcePoll, TaskError> {
        if self.next >= self.items.len() {
            return Ok(SourcePoll::End);
        }
        while self.next < self.items.len() && out.len() < max_records {
            out.push(self.items[self.next].clone());
            self.next += self.stride;
        }
        Ok(SourcePoll::Data)
    }

    fn position(&self) -> Vec<u8> {
        (self.next as u64).to_le_bytes().to_vec()
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

    fn flush(&mut self) -> Result<(), TaskError> {
        Ok(())
    }

    fn finish(&mut self) -> Result<(), TaskError> {
        Ok(())
    }
}
