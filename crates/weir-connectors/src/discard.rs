//! A sink that drops every record (benchmarks, jobs run only for their side effects).

use weir_api::error::TaskError;
use weir_api::operator::TaskContext;
use weir_api::sink::{Sink, SinkWriter};

/// A sink that drops everything it receives.
#[derive(Clone, Copy, Debug, Default)]
pub struct DiscardSink;

impl DiscardSink {
    /// A discarding sink.
    pub fn new() -> DiscardSink {
        DiscardSink
    }
}

impl<T: Send + 'static> Sink<T> for DiscardSink {
    fn create_writer(&self, _ctx: &TaskContext) -> Result<Box<dyn SinkWriter<T>>, TaskError> {
        Ok(Box::new(DiscardWriter))
    }
}

struct DiscardWriter;

impl<T: Send> SinkWriter<T> for DiscardWriter {
    fn write_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError> {
        batch.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_batches() {
        let ctx = TaskContext::for_test(0, 1, 8);
        let mut writer = Sink::<String>::create_writer(&DiscardSink::new(), &ctx).unwrap();
        let mut batch = vec!["a".to_string(), "b".to_string()];
        writer.write_batch(&mut batch).unwrap();
        assert!(batch.is_empty());
        writer.flush().unwrap();
        writer.finish().unwrap();
    }
}
