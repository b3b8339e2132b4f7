//! Side outputs (Flink's `OutputTag`): a function emits records of another type next to its
//! main output, and `get_side_output(&tag)` reads them as a stream of their own (late window
//! records, say).
//!
//! The runtime builds each requested side output's link (a channel output of the side type)
//! and hands it to the producing operator through the task context; the operator buffers
//! what its function emits per tag and sends it on with its own output, and passes
//! watermarks, barriers and the end of input to the side links too, so a side output is
//! exactly as consistent as the main one.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use crate::error::TaskError;
use crate::operator::{NO_TIMESTAMP, Operator};
use crate::snapshot::{Barrier, TaskSnapshot};

/// Names a side output and its record type.
pub struct OutputTag<S> {
    id: String,
    _type: PhantomData<fn() -> S>,
}

impl<S> Clone for OutputTag<S> {
    fn clone(&self) -> Self {
        OutputTag { id: self.id.clone(), _type: PhantomData }
    }
}

impl<S> OutputTag<S> {
    /// A tag named `id` (unique per producing operator).
    pub fn new(id: &str) -> Self {
        OutputTag { id: id.to_string(), _type: PhantomData }
    }

    /// The tag's name.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// One side output's link, type-erased for the operator that feeds it.
pub trait SideLink: Send {
    /// For pushing records of the link's type.
    fn as_any(&mut self) -> &mut dyn Any;
    /// Sends what was buffered on.
    fn emit(&mut self) -> Result<(), TaskError>;
    /// Passes a watermark on (after the buffered records).
    fn process_watermark(&mut self, watermark: i64) -> Result<(), TaskError>;
    /// Passes a watermark status on.
    fn process_watermark_status(&mut self, idle: bool) -> Result<(), TaskError>;
    /// Passes a barrier on (after the buffered records).
    fn snapshot_state(&mut self, barrier: &Barrier, snapshot: &mut TaskSnapshot) -> Result<(), TaskError>;
    /// The producer's input ended.
    fn end_input(&mut self) -> Result<(), TaskError>;
    /// Hands partial batches on.
    fn flush(&mut self) -> Result<(), TaskError>;
}

/// A side link of records `S`: their buffer and the link after it.
pub struct TypedSideLink<S> {
    records: Vec<S>,
    timestamps: Vec<i64>,
    link: Box<dyn Operator<S>>,
}

impl<S> TypedSideLink<S> {
    /// Buffers into `link`.
    pub fn new(link: Box<dyn Operator<S>>) -> Self {
        TypedSideLink { records: Vec::new(), timestamps: Vec::new(), link }
    }
}

impl<S: Send + 'static> SideLink for TypedSideLink<S> {
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
    fn emit(&mut self) -> Result<(), TaskError> {
        if self.records.is_empty() {
            return Ok(());
        }
        self.link.process_timestamped_batch(&mut self.records, &mut self.timestamps, &mut Vec::new())
    }
    fn process_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
        self.emit()?;
        self.link.process_watermark(watermark)
    }
    fn process_watermark_status(&mut self, idle: bool) -> Result<(), TaskError> {
        self.link.process_watermark_status(idle)
    }
    fn snapshot_state(&mut self, barrier: &Barrier, snapshot: &mut TaskSnapshot) -> Result<(), TaskError> {
        self.emit()?;
        self.link.snapshot_state(barrier, snapshot)
    }
    fn end_input(&mut self) -> Result<(), TaskError> {
        self.emit()?;
        self.link.end_input()
    }
    fn flush(&mut self) -> Result<(), TaskError> {
        self.emit()?;
        self.link.flush()
    }
}

/// One side output's tag and link.
pub type NamedSideLink = (String, Box<dyn SideLink>);

/// The side links of one operator, by tag (handed over by the runtime in the task context).
pub type SideLinks = Arc<Mutex<Vec<NamedSideLink>>>;

/// An operator's side outputs.
#[derive(Default)]
pub struct SideOutputs {
    links: Vec<NamedSideLink>,
}

impl SideOutputs {
    /// Takes the side links the runtime built for the operator of `ctx`.
    pub fn take(ctx: &crate::operator::TaskContext) -> SideOutputs {
        let links = match &ctx.side_outputs {
            Some(links) => std::mem::take(&mut *links.lock().unwrap_or_else(|p| p.into_inner())),
            None => Vec::new(),
        };
        SideOutputs { links }
    }

    /// True when nobody reads a side output of this operator.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// Buffers `value` for side output `tag` (dropped when nobody reads it, as in Flink).
    pub(crate) fn push<S: 'static>(&mut self, tag: &OutputTag<S>, value: S, timestamp: i64) -> Result<(), String> {
        let Some((_, link)) = self.links.iter_mut().find(|(id, _)| id == tag.id()) else { return Ok(()) };
        match link.as_any().downcast_mut::<TypedSideLink<S>>() {
            Some(typed) => {
                typed.records.push(value);
                typed.timestamps.push(timestamp);
                Ok(())
            }
            None => Err(format!(
                "side output '{}' is read as another type than {} (one tag, one type)",
                tag.id(),
                std::any::type_name::<S>()
            )),
        }
    }

    /// Sends every buffer on.
    pub fn emit(&mut self) -> Result<(), TaskError> {
        for (_, link) in &mut self.links {
            link.emit()?;
        }
        Ok(())
    }

    /// Passes a watermark to every side link.
    pub fn process_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
        for (_, link) in &mut self.links {
            link.process_watermark(watermark)?;
        }
        Ok(())
    }

    /// Passes a watermark status to every side link.
    pub fn process_watermark_status(&mut self, idle: bool) -> Result<(), TaskError> {
        for (_, link) in &mut self.links {
            link.process_watermark_status(idle)?;
        }
        Ok(())
    }

    /// Passes a barrier to every side link.
    pub fn snapshot_state(&mut self, barrier: &Barrier, snapshot: &mut TaskSnapshot) -> Result<(), TaskError> {
        for (_, link) in &mut self.links {
            link.snapshot_state(barrier, snapshot)?;
        }
        Ok(())
    }

    /// Ends every side link's input.
    pub fn end_input(&mut self) -> Result<(), TaskError> {
        for (_, link) in &mut self.links {
            link.end_input()?;
        }
        Ok(())
    }

    /// Flushes every side link.
    pub fn flush(&mut self) -> Result<(), TaskError> {
        for (_, link) in &mut self.links {
            link.flush()?;
        }
        Ok(())
    }
}

/// The timestamp a side record gets when the collector has none.
pub(crate) const SIDE_NO_TIMESTAMP: i64 = NO_TIMESTAMP;
