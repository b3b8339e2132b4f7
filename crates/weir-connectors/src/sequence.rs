//! A parallel, rescalable sequence generator source with an optional rate limit.
//!
//! The index space `0..count` is cut into `S = max_parallelism` splits: split `k` holds the
//! indices `i` with `i % S == k`. Subtask `index` of `p` owns the contiguous split range
//! [`compute_key_group_range_for_operator_index`]`(S, p, index)`, exactly as it would own
//! key groups, so a checkpointed position (per split: the next index) can be handed to any
//! new parallelism: each new subtask picks the entries of the splits it now owns.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use weir_api::error::TaskError;
use weir_api::operator::{IDLE_WAIT_MAX, TaskContext};
use weir_api::snapshot::Redistribution;
use weir_api::source::{Boundedness, Source, SourcePoll, SourcePositions, SourceReader};
use weir_types::compute_key_group_range_for_operator_index;

/// Records taken from one split before moving on to the next (round-robin).
const CHUNK: u64 = 256;
/// Shortest idle wait asked for when rate limited (below that, sleeping is not precise).
const IDLE_WAIT_MIN: Duration = Duration::from_micros(100);
/// How much unused allowance a rate-limited reader may save up, in seconds of its rate:
/// enough to absorb a late wake-up without losing rate, too little to burst noticeably.
const BURST_SECONDS: f64 = 0.1;

/// Generates `make(i)` for `i` in `0..count` (or forever), in parallel and optionally
/// rate limited.
pub struct SequenceSource<T> {
    count: Option<u64>,
    rate_per_second: Option<f64>,
    make: fn(u64) -> T,
    in_index_order: bool,
}

impl<T> SequenceSource<T> {
    /// A source of `make(i)` for `i` in `0..count` (unbounded when `count` is `None`),
    /// emitting at most `rate_per_second` records per second over all subtasks when set.
    ///
    /// An infinite rate means no limit; a rate that is not positive (or NaN) makes
    /// `create_reader` fail.
    pub fn new(count: Option<u64>, rate_per_second: Option<f64>, make: fn(u64) -> T) -> SequenceSource<T> {
        SequenceSource { count, rate_per_second, make, in_index_order: false }
    }

    /// Each subtask emits its indices in increasing order (one index per owned split per
    /// round, lagging splits first), so records whose event time grows with the index come
    /// in order per subtask: monotonous timestamps, no late records. Slower per record than
    /// the default chunked order.
    pub fn in_index_order(mut self) -> Self {
        self.in_index_order = true;
        self
    }

    /// Decodes position elements of [`SourceReader::snapshot_positions`] (one
    /// `(split, next_index, splits)` per element, any number of old subtasks' elements
    /// together; snapshots of weir 0.1 before the split count was recorded hold
    /// `(split, next_index)`) for [`SequenceSource::reader_from_positions`].
    pub fn decode_positions(elements: &[Vec<u8>]) -> Result<Vec<Position>, TaskError> {
        let mut positions = Vec::with_capacity(elements.len());
        for bytes in elements {
            let entry = match postcard::from_bytes::<(u32, u64, u32)>(bytes) {
                Ok((split, next, splits)) => Position { split, next, splits: Some(splits) },
                Err(_) => {
                    let (split, next): (u32, u64) = postcard::from_bytes(bytes).map_err(|e| {
                        TaskError::external(
                            "sequence source: decoding a checkpointed position",
                            format!(
                                "{e}; the snapshot is corrupt or its 'source' state was not written by a sequence source"
                            ),
                        )
                    })?;
                    Position { split, next, splits: None }
                }
            };
            positions.push(entry);
        }
        Ok(positions)
    }
}

/// A checkpointed position: the next index of `split`, of `splits` splits (`None`: as many
/// as the restoring job's max parallelism, for positions written before the count was kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// The split.
    pub split: u32,
    /// The next index it produces.
    pub next: u64,
    /// How many splits the index space was cut into.
    pub splits: Option<u32>,
}

/// Positions taken with `old` splits, as positions of `new` splits (`new` a multiple of
/// `old`): new split `j` lies inside old split `j mod old`, whose indices below its next one
/// were all produced, so `j` resumes at its first index at or after that.
fn regroup_positions(positions: &[(u32, u64)], old: u32, new: u32) -> Vec<(u32, u64)> {
    let stride = u64::from(new);
    let mut out = Vec::with_capacity(positions.len() * (new / old) as usize);
    for &(split, next) in positions {
        for j in (split..new).step_by(old as usize) {
            let j64 = u64::from(j);
            let resume = if next <= j64 { j64 } else { j64 + (next - j64).div_ceil(stride) * stride };
            out.push((j, resume));
        }
    }
    out
}

impl<T: Send + 'static> SequenceSource<T> {
    /// The reader of subtask `ctx.subtask_index`, resuming each owned split at its entry in
    /// `positions` (typically the decoded positions of any number of old subtasks). Entries of
    /// splits this subtask does not own are ignored; an owned split without an entry starts
    /// from its beginning. Positions taken under a max parallelism that divides the current
    /// one (a snapshot rewritten with `weir savepoint rewrite`) are regrouped.
    pub fn reader_from_positions(
        &self,
        ctx: &TaskContext,
        positions: Vec<Position>,
    ) -> Result<Box<dyn SourceReader<T>>, TaskError> {
        let splits_total = ctx.max_parallelism;
        let recorded: std::collections::BTreeSet<u32> =
            positions.iter().map(|p| p.splits.unwrap_or(splits_total)).collect();
        let pairs: Vec<(u32, u64)> = positions.iter().map(|p| (p.split, p.next)).collect();
        let pairs = match recorded.iter().copied().collect::<Vec<_>>().as_slice() {
            [] => pairs,
            [old] if *old == splits_total => pairs,
            [old] if *old > 0 && splits_total.is_multiple_of(*old) => {
                // Every old split index must exist before it is regrouped.
                if let Some(bad) = pairs.iter().find(|(split, _)| split >= old) {
                    return Err(TaskError::external(
                        "sequence source: restoring a position",
                        format!("split {} does not exist among {old} splits; the checkpoint is corrupt", bad.0),
                    ));
                }
                regroup_positions(&pairs, *old, splits_total)
            }
            [old] => {
                return Err(TaskError::external(
                    "sequence source: restoring a position",
                    format!(
                        "its positions were taken with {old} splits (max parallelism {old}); it resumes under a \
                         max parallelism that is a multiple of {old}, not {splits_total} (rewrite the savepoint to \
                         a multiple of {old})"
                    ),
                ));
            }
            several => {
                return Err(TaskError::external(
                    "sequence source: restoring a position",
                    format!("positions with different split counts {several:?}; the checkpoint is corrupt"),
                ));
            }
        };
        Ok(Box::new(self.build_reader(ctx, pairs)?))
    }

    fn build_reader(&self, ctx: &TaskContext, positions: Vec<(u32, u64)>) -> Result<SequenceReader<T>, TaskError> {
        let (splits_total, parallelism, index) = (ctx.max_parallelism, ctx.parallelism, ctx.subtask_index);
        if splits_total == 0 || parallelism == 0 || index >= parallelism {
            return Err(TaskError::Internal(format!(
                "sequence source: invalid task context (subtask {index} of {parallelism}, max parallelism {splits_total})"
            )));
        }
        let stride = u64::from(splits_total);
        let limit = self.count.unwrap_or(u64::MAX);

        let mut resume: HashMap<u32, u64> = HashMap::with_capacity(positions.len());
        for (split, next) in positions {
            if split >= splits_total {
                return Err(TaskError::external(
                    "sequence source: restoring a position",
                    format!(
                        "split {split} does not exist with max parallelism {splits_total}; \
                         restore with the max parallelism the checkpoint was taken with"
                    ),
                ));
            }
            let congruent = next >= u64::from(split) && (next - u64::from(split)) % stride == 0;
            if next < limit && !congruent {
                return Err(TaskError::external(
                    "sequence source: restoring a position",
                    format!(
                        "index {next} does not belong to split {split} of {splits_total}; \
                         the checkpoint is corrupt or from another max parallelism"
                    ),
                ));
            }
            if let Some(previous) = resume.insert(split, next)
                && previous != next
            {
                return Err(TaskError::external(
                    "sequence source: restoring a position",
                    format!("split {split} appears twice, at {previous} and {next}; the checkpoint is corrupt"),
                ));
            }
        }

        let owned = compute_key_group_range_for_operator_index(splits_total, parallelism, index);
        let splits: Vec<SplitCursor> = owned
            .iter()
            .map(|split| SplitCursor { split, next: resume.get(&split).copied().unwrap_or(u64::from(split)) })
            .collect();
        let active = (0..splits.len()).filter(|&slot| splits[slot].next < limit).collect();

        let pacer = match self.rate_per_second {
            None => None,
            Some(rate) if rate.is_infinite() && rate > 0.0 => None,
            Some(rate) if rate.is_finite() && rate > 0.0 => {
                let share = rate * f64::from(owned.len()) / f64::from(splits_total);
                (share > 0.0).then(|| Pacer::new(share))
            }
            Some(rate) => {
                return Err(TaskError::user(
                    "sequence source",
                    format!("rate_per_second must be a positive number, got {rate}"),
                ));
            }
        };

        Ok(SequenceReader {
            make: self.make,
            stride,
            limit,
            splits,
            active,
            cursor: 0,
            pacer,
            in_index_order: self.in_index_order,
        })
    }
}

impl<T: Send + 'static> Source<T> for SequenceSource<T> {
    fn boundedness(&self) -> Boundedness {
        if self.count.is_some() { Boundedness::Bounded } else { Boundedness::Unbounded }
    }

    fn create_reader(&self, ctx: &TaskContext) -> Result<Box<dyn SourceReader<T>>, TaskError> {
        self.reader_from_positions(ctx, Vec::new())
    }

    fn restore_reader(
        &self,
        ctx: &TaskContext,
        positions: Vec<Vec<u8>>,
    ) -> Result<Box<dyn SourceReader<T>>, TaskError> {
        // Union state: every subtask sees every split's position and keeps its own splits.
        self.reader_from_positions(ctx, Self::decode_positions(&positions)?)
    }

    fn check_restore(&self, positions: &[Vec<u8>]) -> Result<Vec<String>, String> {
        Self::decode_positions(positions).map_err(|e| e.to_string())?;
        Ok(Vec::new())
    }
}

/// One owned split and the next index it will produce.
#[derive(Clone, Copy, Debug)]
struct SplitCursor {
    split: u32,
    next: u64,
}

/// Reads the splits of one subtask.
struct SequenceReader<T> {
    make: fn(u64) -> T,
    /// Distance between consecutive indices of a split (the number of splits).
    stride: u64,
    /// First index not produced (`count`, or `u64::MAX` when unbounded).
    limit: u64,
    /// Every owned split, exhausted ones included (their position says they are done).
    splits: Vec<SplitCursor>,
    /// Slots in `splits` not yet exhausted, in round-robin order.
    active: Vec<usize>,
    /// Slot in `active` to take the next chunk from.
    cursor: usize,
    pacer: Option<Pacer>,
    /// Emit indices in increasing order ([`SequenceSource::in_index_order`]).
    in_index_order: bool,
}

/// Indices left in a split whose next index is `next`.
#[inline]
fn remaining_in_split(next: u64, limit: u64, stride: u64) -> u64 {
    if next >= limit { 0 } else { (limit - 1 - next) / stride + 1 }
}

impl<T> SequenceReader<T> {
    /// Appends up to `budget` records in increasing index order: in each round (`next /
    /// stride`), starting with the lowest, one record of every split at that round.
    fn fill_in_order(&mut self, out: &mut Vec<T>, budget: usize) -> usize {
        let before = out.len();
        let (stride, limit, make) = (self.stride, self.limit, self.make);
        while out.len() - before < budget && !self.active.is_empty() {
            let Some(round) = self.active.iter().map(|&slot| self.splits[slot].next / stride).min() else { break };
            for &slot in &self.active {
                if out.len() - before >= budget {
                    break;
                }
                let cursor = &mut self.splits[slot];
                if cursor.next / stride == round {
                    out.push(make(cursor.next));
                    cursor.next = cursor.next.saturating_add(stride);
                }
            }
            let splits = &self.splits;
            self.active.retain(|&slot| splits[slot].next < limit);
        }
        out.len() - before
    }

    /// Appends up to `budget` records, taking chunks from the active splits round-robin.
    fn fill(&mut self, out: &mut Vec<T>, budget: usize) -> usize {
        if self.in_index_order {
            return self.fill_in_order(out, budget);
        }
        let before = out.len();
        let mut wanted = budget as u64;
        let (stride, limit, make) = (self.stride, self.limit, self.make);
        out.reserve(budget.min(self.remaining_hint()));
        while wanted > 0 && !self.active.is_empty() {
            if self.cursor >= self.active.len() {
                self.cursor = 0;
            }
            let cursor = &mut self.splits[self.active[self.cursor]];
            let left = remaining_in_split(cursor.next, limit, stride);
            let take = left.min(wanted).min(CHUNK);
            let first = cursor.next;
            out.extend((0..take).map(|offset| make(first + offset * stride)));
            // `first + (take - 1) * stride` is below `limit`; one more stride may overflow
            // only for an unbounded source at the very end of u64, which then ends.
            cursor.next = (first + (take - 1) * stride).saturating_add(stride);
            wanted -= take;
            if take == left {
                self.active.remove(self.cursor);
            } else {
                self.cursor += 1;
            }
        }
        out.len() - before
    }

    /// Records left over all active splits, saturating (for reserving capacity only).
    fn remaining_hint(&self) -> usize {
        let mut total: u64 = 0;
        for &slot in &self.active {
            total = total.saturating_add(remaining_in_split(self.splits[slot].next, self.limit, self.stride));
            if total >= CHUNK * 4 {
                break;
            }
        }
        usize::try_from(total).unwrap_or(usize::MAX)
    }
}

impl<T: Send> SourceReader<T> for SequenceReader<T> {
    fn poll_next(&mut self, out: &mut Vec<T>, max_records: usize) -> Result<SourcePoll, TaskError> {
        if self.active.is_empty() {
            return Ok(SourcePoll::End);
        }
        let mut budget = max_records.saturating_sub(out.len());
        if budget == 0 {
            return Ok(SourcePoll::Data);
        }
        if let Some(pacer) = &mut self.pacer {
            match pacer.allowance(Instant::now()) {
                Ok(allowed) => budget = budget.min(allowed),
                Err(wait) => return Ok(SourcePoll::Idle(wait)),
            }
        }
        let produced = self.fill(out, budget);
        if let Some(pacer) = &mut self.pacer {
            pacer.spend(produced);
        }
        Ok(SourcePoll::Data)
    }

    fn snapshot_positions(&self) -> SourcePositions {
        let mut elements = Vec::with_capacity(self.splits.len());
        for cursor in &self.splits {
            // Serializing three integers into memory cannot fail.
            let position = (cursor.split, cursor.next, self.stride as u32);
            elements.push(postcard::to_allocvec(&position).unwrap_or_default());
        }
        SourcePositions { mode: Redistribution::Union, elements }
    }
}

/// A token bucket: `rate` records per second, emitted in batches of at most `batch_max`.
#[derive(Debug)]
struct Pacer {
    rate: f64,
    batch_max: usize,
    burst_max: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl Pacer {
    fn new(rate: f64) -> Pacer {
        // Batches of about 10 ms worth of records keep the output smooth.
        let batch_max = ((rate / 100.0) as usize).max(1);
        let burst_max = (rate * BURST_SECONDS).max(batch_max as f64).max(1.0);
        Pacer { rate, batch_max, burst_max, tokens: 1.0, last: None }
    }

    /// How many records may be emitted now, or how long to wait for the next one.
    fn allowance(&mut self, now: Instant) -> Result<usize, Duration> {
        if let Some(last) = self.last {
            let elapsed = now.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.rate).min(self.burst_max);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            Ok((self.tokens as usize).min(self.batch_max))
        } else {
            let seconds = (1.0 - self.tokens) / self.rate;
            let wait = Duration::try_from_secs_f64(seconds).unwrap_or(IDLE_WAIT_MAX);
            Err(wait.clamp(IDLE_WAIT_MIN, IDLE_WAIT_MAX))
        }
    }

    fn spend(&mut self, records: usize) {
        self.tokens -= records as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use weir_api::operator::BATCH_RECORDS_MAX;

    fn identity(i: u64) -> u64 {
        i
    }

    /// Polls until End (or `max_polls`), returning everything read.
    fn drain(reader: &mut dyn SourceReader<u64>, max_records: usize) -> Vec<u64> {
        let mut all = Vec::new();
        let mut batch = Vec::new();
        loop {
            match reader.poll_next(&mut batch, max_records).unwrap() {
                SourcePoll::Data => all.append(&mut batch),
                SourcePoll::Idle(d) => std::thread::sleep(d),
                SourcePoll::End => {
                    assert!(batch.is_empty());
                    return all;
                }
            }
        }
    }

    #[test]
    fn boundedness_follows_count() {
        assert_eq!(SequenceSource::new(Some(3), None, identity).boundedness(), Boundedness::Bounded);
        assert_eq!(SequenceSource::new(None, None, identity).boundedness(), Boundedness::Unbounded);
    }

    #[test]
    fn single_subtask_produces_everything() {
        let source = SequenceSource::new(Some(1000), None, identity);
        let mut reader = source.create_reader(&TaskContext::for_test(0, 1, 8)).unwrap();
        let mut got = drain(reader.as_mut(), BATCH_RECORDS_MAX);
        got.sort_unstable();
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn in_index_order_each_subtask_emits_increasing_indices_even_after_an_uneven_restore() {
        let source = SequenceSource::new(Some(5000), None, identity).in_index_order();
        let mut all = Vec::new();
        for subtask in 0..3 {
            let mut reader = source.create_reader(&TaskContext::for_test(subtask, 3, 16)).unwrap();
            let got = drain(reader.as_mut(), 37);
            assert!(got.windows(2).all(|w| w[0] < w[1]), "subtask {subtask} out of order");
            all.extend(got);
        }
        all.sort_unstable();
        assert_eq!(all, (0..5000).collect::<Vec<_>>());
        // Splits restored at different rounds: the lagging ones catch up first, in order.
        let positions: Vec<Position> = (0..16u32)
            .map(|split| Position { split, next: u64::from(split) + 16 * u64::from(split % 4), splits: Some(16) })
            .collect();
        let mut reader = source.reader_from_positions(&TaskContext::for_test(0, 1, 16), positions).unwrap();
        let got = drain(reader.as_mut(), 50);
        assert!(got.windows(2).all(|w| w[0] < w[1]), "out of order after restore");
        assert_eq!(got.len(), 5000 - 4 * (1 + 2 + 3), "each split skips the rounds it starts at");
    }

    #[test]
    fn subtask_without_splits_ends_at_once() {
        let source = SequenceSource::new(None, Some(100.0), identity);
        let mut reader = source.create_reader(&TaskContext::for_test(2, 3, 2)).unwrap();
        let mut out = Vec::new();
        assert_eq!(reader.poll_next(&mut out, 10).unwrap(), SourcePoll::End);
        assert!(out.is_empty());
    }

    #[test]
    fn respects_max_records_and_appends() {
        let source = SequenceSource::new(None, None, identity);
        let mut reader = source.create_reader(&TaskContext::for_test(0, 1, 4)).unwrap();
        let mut out = vec![99];
        assert_eq!(reader.poll_next(&mut out, 10).unwrap(), SourcePoll::Data);
        assert_eq!(out.len(), 10);
        assert_eq!(out[0], 99);
    }

    #[test]
    fn invalid_rate_is_an_error() {
        for rate in [0.0, -1.0, f64::NAN, f64::NEG_INFINITY] {
            let source = SequenceSource::new(Some(10), Some(rate), identity);
            assert!(source.create_reader(&TaskContext::for_test(0, 1, 4)).is_err());
        }
        let source = SequenceSource::new(Some(10), Some(f64::INFINITY), identity);
        let mut reader = source.create_reader(&TaskContext::for_test(0, 1, 4)).unwrap();
        assert_eq!(drain(reader.as_mut(), 100).len(), 10);
    }

    #[test]
    fn rate_is_roughly_respected() {
        let source = SequenceSource::new(None, Some(2000.0), identity);
        let mut reader = source.create_reader(&TaskContext::for_test(0, 1, 8)).unwrap();
        let started = Instant::now();
        let mut batch = Vec::new();
        let (mut total, mut largest) = (0usize, 0usize);
        while started.elapsed() < Duration::from_millis(300) {
            match reader.poll_next(&mut batch, BATCH_RECORDS_MAX).unwrap() {
                SourcePoll::Data => {
                    largest = largest.max(batch.len());
                    total += batch.len();
                    batch.clear();
                }
                SourcePoll::Idle(d) => {
                    assert!(d > Duration::ZERO && d <= IDLE_WAIT_MAX);
                    std::thread::sleep(d);
                }
                SourcePoll::End => panic!("an unbounded source ended"),
            }
        }
        assert!((400..=900).contains(&total), "{total} records in 0.3 s at 2000/s");
        assert!(largest <= 20, "batches of {largest} records at 2000/s");
    }

    #[test]
    fn rate_is_shared_by_owned_splits() {
        // Subtask 0 of 4 owns 2 of 8 splits: a quarter of the rate.
        let pacer_rate = |index| {
            let source = SequenceSource::new(None, Some(800.0), identity);
            source.build_reader(&TaskContext::for_test(index, 4, 8), Vec::new()).unwrap().pacer.unwrap().rate
        };
        assert_eq!(pacer_rate(0), 200.0);
        assert_eq!(pacer_rate(3), 200.0);
    }

    #[test]
    fn position_round_trip_resumes_exactly() {
        let source = SequenceSource::new(Some(5000), None, identity);
        let ctx = TaskContext::for_test(0, 1, 8);
        let mut reader = source.create_reader(&ctx).unwrap();
        let mut first = Vec::new();
        for _ in 0..3 {
            reader.poll_next(&mut first, 700).unwrap();
        }
        let positions = SequenceSource::<u64>::decode_positions(&reader.snapshot_positions().elements).unwrap();
        assert_eq!(positions.len(), 8);
        let mut resumed = source.reader_from_positions(&ctx, positions).unwrap();
        let mut all = first.clone();
        all.extend(drain(resumed.as_mut(), 333));
        all.sort_unstable();
        assert_eq!(all, (0..5000).collect::<Vec<_>>());
    }

    #[test]
    fn positions_rescale_from_three_to_two_subtasks() {
        let source = SequenceSource::new(Some(10_000), None, identity);
        let mut seen = Vec::new();
        let mut positions = Vec::new();
        for index in 0..3 {
            let mut reader = source.create_reader(&TaskContext::for_test(index, 3, 16)).unwrap();
            let mut out = Vec::new();
            for _ in 0..=index {
                reader.poll_next(&mut out, 500).unwrap();
            }
            seen.extend(out);
            positions.extend(SequenceSource::<u64>::decode_positions(&reader.snapshot_positions().elements).unwrap());
        }
        // Drop one old subtask's entries: its splits restart from the beginning.
        for index in 0..2 {
            let mut reader =
                source.reader_from_positions(&TaskContext::for_test(index, 2, 16), positions.clone()).unwrap();
            seen.extend(drain(reader.as_mut(), BATCH_RECORDS_MAX));
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..10_000).collect::<Vec<_>>());
    }

    #[test]
    fn exhausted_splits_stay_exhausted_after_restore() {
        let source = SequenceSource::new(Some(10), None, identity);
        let ctx = TaskContext::for_test(0, 1, 4);
        let mut reader = source.create_reader(&ctx).unwrap();
        assert_eq!(drain(reader.as_mut(), 3).len(), 10);
        let positions = SequenceSource::<u64>::decode_positions(&reader.snapshot_positions().elements).unwrap();
        let mut resumed = source.reader_from_positions(&ctx, positions).unwrap();
        assert!(drain(resumed.as_mut(), 3).is_empty());
    }

    /// Positions as snapshots before the split count was recorded hold them.
    fn legacy(pairs: &[(u32, u64)]) -> Vec<Position> {
        pairs.iter().map(|&(split, next)| Position { split, next, splits: None }).collect()
    }

    #[test]
    fn bad_positions_are_errors() {
        let source = SequenceSource::new(Some(100), None, identity);
        let ctx = TaskContext::for_test(0, 1, 4);
        assert!(source.reader_from_positions(&ctx, legacy(&[(4, 4)])).is_err());
        assert!(source.reader_from_positions(&ctx, legacy(&[(1, 6)])).is_err());
        assert!(source.reader_from_positions(&ctx, legacy(&[(1, 5), (1, 9)])).is_err());
        assert!(source.reader_from_positions(&ctx, legacy(&[(1, 5), (1, 5), (2, 1000)])).is_ok());
        assert!(SequenceSource::<u64>::decode_positions(&[vec![0xff, 0xff]]).is_err());
        // Positions written before the split count was recorded still decode.
        let old = postcard::to_allocvec(&(1u32, 5u64)).unwrap();
        assert_eq!(SequenceSource::<u64>::decode_positions(&[old]).unwrap(), legacy(&[(1, 5)]));
    }

    /// A snapshot rewritten to a multiple of its max parallelism resumes exactly: every index
    /// once, over the old reader and the new subtasks together; any other number is refused.
    #[test]
    fn positions_regroup_under_a_multiple_of_the_max_parallelism() {
        let source = SequenceSource::new(Some(1000), None, identity);
        let mut reader = source.create_reader(&TaskContext::for_test(0, 1, 4)).unwrap();
        let mut first = Vec::new();
        for _ in 0..3 {
            reader.poll_next(&mut first, 97).unwrap();
        }
        let positions = SequenceSource::<u64>::decode_positions(&reader.snapshot_positions().elements).unwrap();
        assert!(positions.iter().all(|p| p.splits == Some(4)));
        let mut all = first.clone();
        for index in 0..3 {
            let ctx = TaskContext::for_test(index, 3, 12);
            let mut resumed = source.reader_from_positions(&ctx, positions.clone()).unwrap();
            all.extend(drain(resumed.as_mut(), 50));
        }
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
        let error = source.reader_from_positions(&TaskContext::for_test(0, 1, 6), positions).err().unwrap();
        assert!(error.to_string().contains("multiple of 4"), "{error}");
    }

    #[test]
    fn unbounded_source_near_u64_max_ends() {
        let source = SequenceSource::new(None, None, identity);
        let ctx = TaskContext::for_test(0, 1, 2);
        let start = u64::MAX - 11; // split 0 (u64::MAX is odd, so this is even)
        let mut reader = source.reader_from_positions(&ctx, legacy(&[(0, start), (1, u64::MAX)])).unwrap();
        let got = drain(reader.as_mut(), 4);
        assert_eq!(got, (0..6).map(|k| start + 2 * k).collect::<Vec<_>>());
    }

    proptest! {
        #[test]
        fn subtasks_partition_the_sequence(p in 1u32..=5, splits in 1u32..=16, count in 0u64..3000, batch in 1usize..1500) {
            let source = SequenceSource::new(Some(count), None, identity);
            let mut seen = Vec::new();
            for index in 0..p {
                let mut reader = source.create_reader(&TaskContext::for_test(index, p, splits)).unwrap();
                seen.extend(drain(reader.as_mut(), batch));
            }
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..count).collect::<Vec<_>>());
        }

        #[test]
        fn restore_after_any_prefix_loses_and_duplicates_nothing(
            p in 1u32..=5, new_p in 1u32..=5, count in 0u64..2000, polls in 0usize..6, batch in 1usize..400,
        ) {
            let source = SequenceSource::new(Some(count), None, identity);
            let mut seen = Vec::new();
            let mut positions = Vec::new();
            for index in 0..p {
                let mut reader = source.create_reader(&TaskContext::for_test(index, p, 8)).unwrap();
                let mut out = Vec::new();
                for _ in 0..polls {
                    let max_records = out.len() + batch;
                    reader.poll_next(&mut out, max_records).unwrap();
                }
                seen.extend(out);
                positions.extend(SequenceSource::<u64>::decode_positions(&reader.snapshot_positions().elements).unwrap());
            }
            for index in 0..new_p {
                let ctx = TaskContext::for_test(index, new_p, 8);
                let mut reader = source.reader_from_positions(&ctx, positions.clone()).unwrap();
                seen.extend(drain(reader.as_mut(), batch));
            }
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..count).collect::<Vec<_>>());
        }
    }

    /// Throughput check; meaningful only in an optimized build:
    /// `cargo test -p weir-connectors --release -- --ignored throughput`.
    #[test]
    #[ignore]
    fn throughput() {
        let source = SequenceSource::new(None, None, identity);
        let mut reader = source.create_reader(&TaskContext::for_test(0, 1, 128)).unwrap();
        let mut batch = Vec::with_capacity(BATCH_RECORDS_MAX);
        let started = Instant::now();
        let mut total = 0u64;
        let mut checksum = 0u64;
        while started.elapsed() < Duration::from_secs(1) {
            for _ in 0..1000 {
                reader.poll_next(&mut batch, BATCH_RECORDS_MAX).unwrap();
                total += batch.len() as u64;
                checksum = checksum.wrapping_add(batch[batch.len() - 1]);
                batch.clear();
            }
        }
        let per_second = total as f64 / started.elapsed().as_secs_f64();
        eprintln!("sequence source: {:.1} M records/s (checksum {checksum})", per_second / 1e6);
        assert!(per_second > 20e6);
    }

    proptest! {
        /// The positions of a reader that read part of its splits, one element mutated:
        /// restoring is an error or a reader that produces at most the source's indices,
        /// never a panic or a claimed-size allocation.
        #[test]
        fn mutated_positions_restore_or_fail_cleanly(
            read in 0usize..40,
            old_version in any::<bool>(),
            element in any::<prop::sample::Index>(),
            mutations in proptest::collection::vec(any::<weir_types::fuzzing::Mutation>(), 1..6),
        ) {
            let source = SequenceSource::new(Some(100), None, identity);
            let ctx = TaskContext::for_test(0, 1, 8);
            let mut reader = source.create_reader(&ctx).unwrap();
            let mut batch = Vec::new();
            let _ = reader.poll_next(&mut batch, read).unwrap();
            let mut elements = reader.snapshot_positions().elements;
            if old_version {
                // weir 0.1's (split, next) elements.
                elements = SequenceSource::<u64>::decode_positions(&elements).unwrap().into_iter().map(|p| postcard::to_allocvec(&(p.split, p.next)).unwrap()).collect();
            }
            let at = element.index(elements.len());
            elements[at] = weir_types::fuzzing::mutate(&elements[at], &mutations);
            let restored = weir_types::fuzzing::with_allocation_cap(64 << 20, || {
                let _ = source.check_restore(&elements);
                let Ok(mut reader) = source.restore_reader(&ctx, elements) else { return Ok(0) };
                let mut produced = 0;
                for _ in 0..1000 {
                    let mut batch = Vec::new();
                    match reader.poll_next(&mut batch, BATCH_RECORDS_MAX) {
                        Ok(SourcePoll::Data) => {
                            if batch.iter().any(|i| *i >= 100) {
                                return Err(format!("an index past the count: {batch:?}"));
                            }
                            produced += batch.len();
                        }
                        Ok(SourcePoll::Idle(_)) => {}
                        Ok(SourcePoll::End) | Err(_) => break,
                    }
                }
                Ok(produced)
            });
            match restored {
                Err(refused) => prop_assert!(false, "restoring asked for {} bytes at once", refused),
                Ok(result) => prop_assert!(result.is_ok(), "{:?}", result),
            }
        }
    }
}
