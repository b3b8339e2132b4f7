//! Runs a [`ProcessFunction`]: a non-keyed function with operator state (list, union list
//! and broadcast state), Flink's `CheckpointedFunction`.

use std::marker::PhantomData;

use crate::error::TaskError;
use crate::functions::{Collector, OperatorStateContext, ProcessFunction};
use crate::operator::{Operator, TaskContext};
use crate::snapshot::{Barrier, OperatorSnapshotData, TaskSnapshot};

/// The operator behind `DataStream::process`.
pub struct ProcessOperator<I, O, F> {
    name: String,
    uid: String,
    func: F,
    out: Vec<O>,
    out_timestamps: Vec<i64>,
    side: crate::side_output::SideOutputs,
    next: Box<dyn Operator<O>>,
    /// Restored as finished: its end-of-input results were emitted before the snapshot.
    finished_on_restore: bool,
    _input: PhantomData<fn(I)>,
}

impl<I, O, F: ProcessFunction<I, O>> ProcessOperator<I, O, F> {
    /// Runs `func` for subtask `ctx.subtask_index`, giving it its restored operator state.
    pub fn new(ctx: &TaskContext, mut func: F, next: Box<dyn Operator<O>>) -> Result<Self, TaskError> {
        let restored = ctx.restored_operator().map(|r| r.operator_states.clone()).unwrap_or_default();
        let mut state = OperatorStateContext::restoring(restored, ctx.subtask_index, ctx.parallelism);
        if let Err(e) = func.initialize_state(&mut state) {
            return Err(TaskError::user(
                &ctx.operator_name,
                format!("initializing operator state of '{}': {e}", ctx.operator_uid),
            ));
        }
        Ok(ProcessOperator {
            name: ctx.operator_name.clone(),
            uid: ctx.operator_uid.clone(),
            func,
            out: Vec::new(),
            out_timestamps: Vec::new(),
            side: crate::side_output::SideOutputs::take(ctx),
            next,
            finished_on_restore: crate::snapshot::RestoredOperator::is_finished(ctx.restored_operator()),
            _input: PhantomData,
        })
    }

    fn emit(&mut self) -> Result<(), TaskError> {
        self.side.emit()?;
        if self.out.is_empty() {
            return Ok(());
        }
        self.next.process_batch(&mut self.out)
    }
}

impl<I: Send, O: Send, F: ProcessFunction<I, O>> Operator<I> for ProcessOperator<I, O, F> {
    fn process_batch(&mut self, batch: &mut Vec<I>) -> Result<(), TaskError> {
        for record in batch.drain(..) {
            let mut out = Collector::new(&mut self.out).with_side(&mut self.side);
            if let Err(e) = self.func.process_element(record, &mut out) {
                return Err(TaskError::user(&self.name, e));
            }
        }
        self.emit()
    }

    fn process_timestamped_batch(
        &mut self,
        batch: &mut Vec<I>,
        timestamps: &mut Vec<i64>,
        hashes: &mut Vec<u32>,
    ) -> Result<(), TaskError> {
        hashes.clear();
        for (record, timestamp) in batch.drain(..).zip(timestamps.drain(..)) {
            let mut out =
                Collector::timestamped(&mut self.out, &mut self.out_timestamps, timestamp).with_side(&mut self.side);
            if let Err(e) = self.func.process_element(record, &mut out) {
                return Err(TaskError::user(&self.name, e));
            }
        }
        self.side.emit()?;
        if self.out.is_empty() {
            return Ok(());
        }
        self.next.process_timestamped_batch(&mut self.out, &mut self.out_timestamps, &mut Vec::new())
    }

    fn process_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
        self.side.process_watermark(watermark)?;
        self.next.process_watermark(watermark)
    }

    fn process_watermark_status(&mut self, idle: bool) -> Result<(), TaskError> {
        self.side.process_watermark_status(idle)?;
        self.next.process_watermark_status(idle)
    }

    fn fire_timers(&mut self, now_ms: u64) -> Result<(), TaskError> {
        self.next.fire_timers(now_ms)
    }

    fn next_timer(&self) -> Option<u64> {
        self.next.next_timer()
    }

    fn end_input(&mut self) -> Result<(), TaskError> {
        if self.finished_on_restore {
            self.side.end_input()?;
            return self.next.end_input();
        }
        let mut out = Collector::new(&mut self.out).with_side(&mut self.side);
        if let Err(e) = self.func.on_end_of_input(&mut out) {
            return Err(TaskError::user(&self.name, e));
        }
        self.emit()?;
        self.side.end_input()?;
        self.next.end_input()
    }

    fn flush(&mut self) -> Result<(), TaskError> {
        self.side.flush()?;
        self.next.flush()
    }

    fn snapshot_state(&mut self, barrier: &Barrier, snapshot: &mut TaskSnapshot) -> Result<(), TaskError> {
        self.side.snapshot_state(barrier, snapshot)?;
        let mut state = OperatorStateContext::snapshotting();
        if let Err(e) = self.func.snapshot_state(&mut state) {
            return Err(TaskError::user(&self.name, format!("snapshotting operator state: {e}")));
        }
        snapshot.operators.push(OperatorSnapshotData {
            uid: self.uid.clone(),
            keyed: None,
            operator_states: state.into_states(),
        });
        self.next.snapshot_state(barrier, snapshot)
    }

    fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        self.next.notify_checkpoint_complete(checkpoint_id)
    }
}
