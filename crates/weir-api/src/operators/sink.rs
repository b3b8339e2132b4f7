//! The last link of a chain: hands batches to a sink writer.

use std::sync::Arc;

use crate::error::TaskError;
use crate::operator::{Operator, TaskMetrics};
use crate::sink::SinkWriter;
use crate::snapshot::{
    Barrier, OperatorSnapshotData, OperatorStateData, Redistribution, SINK_COMMITTABLES_STATE, TaskSnapshot,
};

/// Writes every batch through a [`SinkWriter`].
pub struct SinkOperator<T> {
    writer: Box<dyn SinkWriter<T>>,
    metrics: Arc<TaskMetrics>,
    uid: String,
}

impl<T> SinkOperator<T> {
    /// Writes through `writer` for the sink with `uid`, counting records out in `metrics`.
    pub fn new(writer: Box<dyn SinkWriter<T>>, metrics: Arc<TaskMetrics>, uid: &str) -> Self {
        SinkOperator { writer, metrics, uid: uid.to_string() }
    }
}

impl<T: Send> Operator<T> for SinkOperator<T> {
    fn process_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError> {
        self.metrics.add_out(batch.len());
        self.writer.write_batch(batch)
    }
    fn process_watermark(&mut self, _watermark: i64) -> Result<(), TaskError> {
        Ok(())
    }
    fn process_watermark_status(&mut self, _idle: bool) -> Result<(), TaskError> {
        Ok(())
    }
    fn fire_timers(&mut self, _now_ms: u64) -> Result<(), TaskError> {
        Ok(())
    }
    fn next_timer(&self) -> Option<u64> {
        None
    }
    fn end_input(&mut self) -> Result<(), TaskError> {
        self.writer.finish()
    }
    fn flush(&mut self) -> Result<(), TaskError> {
        self.writer.flush()
    }
    fn snapshot_state(&mut self, barrier: &Barrier, snapshot: &mut TaskSnapshot) -> Result<(), TaskError> {
        let committables = self.writer.prepare_commit_at(barrier)?;
        snapshot.operators.push(OperatorSnapshotData {
            uid: self.uid.clone(),
            keyed: None,
            operator_states: vec![OperatorStateData {
                name: SINK_COMMITTABLES_STATE.to_string(),
                mode: Redistribution::Union,
                elements: committables,
            }],
        });
        Ok(())
    }
    fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        self.writer.commit(checkpoint_id)
    }
}
