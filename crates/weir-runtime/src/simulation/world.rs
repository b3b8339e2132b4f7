//! The simulated world around the control plane: a seeded random source, object storage, the
//! HA store and the external system the job's transactional sink commits to.

use std::collections::BTreeMap;

use weir_checkpoint::format::SnapshotMetadata;

/// The simulation's random source: every choice of a run follows from its seed.
pub use weir_types::seeded::SeededRng as SimRng;

/// What a subtask's state file holds: where its input stands and the transactions it staged
/// and has not seen committed.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskState {
    pub offset: u64,
    pub pending: Vec<Txn>,
}

/// A transaction of one subtask's sink: the records `from..to` of its input, staged at
/// checkpoint `checkpoint`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Txn {
    /// The job that staged it (transactional ids carry the job id, as Kafka's sink's do).
    pub job: u32,
    pub checkpoint: u64,
    pub from: u64,
    pub to: u64,
}

/// An object in the simulated store.
#[derive(Clone, Debug)]
pub enum Object {
    Metadata(Box<SnapshotMetadata>),
    State(TaskState),
}

/// Object storage as `file://` checkpoints see it: a put is atomic and durable once answered
/// (object_store writes a staged file, fsyncs it and renames it, fsyncing the directory),
/// listing is consistent, and a deletion is not synced: until the directory is fsynced by a
/// later put into it, or the kernel writes it back, a crash of the machine brings the file
/// back.
#[derive(Default)]
pub struct SimStorage {
    pub objects: BTreeMap<String, Object>,
    /// Deleted, the deletion not yet durable.
    unsynced_deletes: Vec<(String, Object)>,
}

fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

impl SimStorage {
    pub fn put(&mut self, path: String, object: Object) {
        // The put fsyncs its directory: earlier deletions in it are durable with it.
        let dir = parent(&path).to_string();
        self.unsynced_deletes.retain(|(deleted, _)| parent(deleted) != dir);
        self.objects.insert(path, object);
    }

    pub fn delete(&mut self, path: &str) {
        if let Some(object) = self.objects.remove(path) {
            self.unsynced_deletes.push((path.to_string(), object));
        }
    }

    pub fn delete_prefix(&mut self, prefix: &str) {
        let prefix = format!("{prefix}/");
        let doomed: Vec<String> = self.objects.keys().filter(|path| path.starts_with(&prefix)).cloned().collect();
        for path in doomed {
            self.delete(&path);
        }
    }

    /// Names of the files directly in `dir`.
    pub fn list(&self, dir: &str) -> Vec<String> {
        let prefix = format!("{dir}/");
        self.objects.keys().filter_map(|path| path.strip_prefix(&prefix)).map(str::to_string).collect()
    }

    /// The kernel wrote every dirty directory back.
    pub fn write_back(&mut self) {
        self.unsynced_deletes.clear();
    }

    /// The machine crashed: deletions not synced are undone. How many.
    pub fn machine_crash(&mut self) -> usize {
        let undone = self.unsynced_deletes.len();
        for (path, object) in self.unsynced_deletes.drain(..) {
            self.objects.entry(path).or_insert(object);
        }
        undone
    }
}

/// How the next HA write goes wrong, when a fault was injected.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HaFlake {
    /// Refused: nothing written, the writer hears an error.
    Refused,
    /// Written, but the answer is lost: the writer hears an error.
    AnswerLost,
}

/// The HA store: a leader lease per epoch, writes fenced on the writer's epoch.
#[derive(Default)]
pub struct SimHa {
    pub epoch: u64,
    pub leader: Option<usize>,
    pub lease_until: u64,
    pub next_checkpoint_id: u64,
    pub pointers: BTreeMap<u64, String>,
    pub finished: bool,
    /// The job was stopped with this savepoint (its result, recorded by the leader).
    pub stopped_with: Option<(u64, String)>,
    /// The job FAILED (its result, recorded by the leader), its newest completed checkpoint
    /// this one (none: it had completed none).
    pub failed: Option<Option<(u64, String)>>,
    pub flake: Option<HaFlake>,
    /// An etcd outage: until this time each write flakes with probability 1/2, drawn from
    /// `outage_rng` (its own stream, so runs without outages stay as they were).
    pub outage_until: u64,
    pub outage_rng: SimRng,
    /// The simulated clock, as of the last step.
    pub now_ms: u64,
}

/// Why an HA write did not take effect (or may have).
#[derive(Debug, PartialEq)]
pub enum HaWriteError {
    LostLeadership,
    Unknown,
}

impl SimHa {
    /// A fenced write by the leader of `epoch`.
    pub fn write(&mut self, epoch: u64, apply: impl FnOnce(&mut SimHa)) -> Result<(), HaWriteError> {
        if epoch != self.epoch {
            return Err(HaWriteError::LostLeadership);
        }
        let in_outage = self.now_ms < self.outage_until && self.outage_rng.one_in(2);
        let outage_flake =
            in_outage.then(|| if self.outage_rng.one_in(2) { HaFlake::Refused } else { HaFlake::AnswerLost });
        match self.flake.take().or(outage_flake) {
            Some(HaFlake::Refused) => Err(HaWriteError::Unknown),
            Some(HaFlake::AnswerLost) => {
                apply(self);
                Err(HaWriteError::Unknown)
            }
            None => {
                apply(self);
                Ok(())
            }
        }
    }
}

/// The external system the sink writes: committed transactions by (subtask, job, checkpoint
/// id); committing one again is a no-op (Kafka's recover-and-commit).
#[derive(Default)]
pub struct External {
    pub committed: BTreeMap<(u32, u32, u64), Txn>,
}

impl External {
    /// Commits `txn` of `subtask`; an error when that transaction was committed with other
    /// records (a checkpoint id handed out twice).
    pub fn commit(&mut self, subtask: u32, txn: Txn) -> Result<(), String> {
        match self.committed.get(&(subtask, txn.job, txn.checkpoint)) {
            Some(existing) if *existing != txn => Err(format!(
                "subtask {subtask}: transaction of checkpoint {} committed as {existing:?} and again as {txn:?}",
                txn.checkpoint
            )),
            Some(_) => Ok(()),
            None => {
                self.committed.insert((subtask, txn.job, txn.checkpoint), txn);
                Ok(())
            }
        }
    }

    /// What subtask `subtask` has committed is exactly its records `0..n`, each once; `n`.
    pub fn committed_prefix(&self, subtask: u32) -> Result<u64, String> {
        let mut ranges: Vec<(u64, u64)> = self
            .committed
            .range((subtask, 0, 0)..=(subtask, u32::MAX, u64::MAX))
            .map(|(_, txn)| (txn.from, txn.to))
            .filter(|(from, to)| from < to)
            .collect();
        ranges.sort_unstable();
        let mut end = 0;
        for (from, to) in ranges {
            if from < end {
                return Err(format!("subtask {subtask}: records {from}..{} committed twice", to.min(end)));
            }
            if from > end {
                return Err(format!("subtask {subtask}: records {end}..{from} lost before committed {from}..{to}"));
            }
            end = to;
        }
        Ok(end)
    }
}
