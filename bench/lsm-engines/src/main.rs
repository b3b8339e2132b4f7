//! The counter's state access written through to an LSM engine: fjall 2 (pure Rust) against
//! RocksDB (the `rocksdb` crate), with the same budgets as weir's `fjall` backend (32 MiB block
//! cache, 64 MiB of write buffers, 1 KiB blocks, no journal sync). Three phases per engine:
//!
//! - load: `USERS` keys written in batches of 4096;
//! - update: `EVENTS` read-modify-writes of user `i % USERS` (a point read, then the new
//!   count into a batch of 4096, read back from the batch while it is pending);
//! - scan: every key group read in key order (what a checkpoint reads).
//!
//! Keys are weir's store keys: table id (2 bytes), key group (2 bytes, 128 groups), key.
//! `BLOCK=<bytes>` sets fjall's block size (weir's 1024 by default; 4096 scanned no faster).

use std::collections::HashMap;
use std::time::Instant;

const USERS: u64 = 10_000_000;
const EVENTS: u64 = 10_000_000;
const BATCH: usize = 4096;
const GROUPS: u64 = 128;

fn store_key(user: u64) -> [u8; 12] {
    let group = (user.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) % GROUPS;
    let mut key = [0u8; 12];
    key[2..4].copy_from_slice(&(group as u16).to_be_bytes());
    key[4..].copy_from_slice(&user.to_be_bytes());
    key
}

trait Engine {
    fn get(&self, key: &[u8]) -> Option<u64>;
    fn write(&self, batch: &[([u8; 12], u64)]);
    /// Entries and bytes of key group `group`, in key order.
    fn scan(&self, group: u16) -> (u64, u64);
}

struct Fjall {
    keyspace: fjall::Keyspace,
    entries: fjall::PartitionHandle,
}

impl Engine for Fjall {
    fn get(&self, key: &[u8]) -> Option<u64> {
        self.entries.get(key).unwrap().map(|v| u64::from_le_bytes(v[..8].try_into().unwrap()))
    }
    fn write(&self, batch: &[([u8; 12], u64)]) {
        let mut b = self.keyspace.batch().durability(None);
        for (key, value) in batch {
            b.insert(&self.entries, key.as_slice(), value.to_le_bytes().as_slice());
        }
        b.commit().unwrap();
    }
    fn scan(&self, group: u16) -> (u64, u64) {
        let mut prefix = [0u8; 4];
        prefix[2..].copy_from_slice(&group.to_be_bytes());
        let mut entries = 0;
        let mut bytes = 0;
        for item in self.entries.prefix(prefix) {
            let (k, v) = item.unwrap();
            entries += 1;
            bytes += (k.len() + v.len()) as u64;
        }
        (entries, bytes)
    }
}

struct Rocks {
    db: rocksdb::DB,
}

impl Engine for Rocks {
    fn get(&self, key: &[u8]) -> Option<u64> {
        self.db.get_pinned(key).unwrap().map(|v| u64::from_le_bytes(v[..8].try_into().unwrap()))
    }
    fn write(&self, batch: &[([u8; 12], u64)]) {
        let mut b = rocksdb::WriteBatch::default();
        for (key, value) in batch {
            b.put(key, value.to_le_bytes());
        }
        let mut options = rocksdb::WriteOptions::default();
        options.disable_wal(true);
        self.db.write_opt(b, &options).unwrap();
    }
    fn scan(&self, group: u16) -> (u64, u64) {
        let mut prefix = [0u8; 4];
        prefix[2..].copy_from_slice(&group.to_be_bytes());
        let mut entries = 0;
        let mut bytes = 0;
        for item in self.db.prefix_iterator(prefix) {
            let (k, v) = item.unwrap();
            if !k.starts_with(&prefix) {
                break;
            }
            entries += 1;
            bytes += (k.len() + v.len()) as u64;
        }
        (entries, bytes)
    }
}

fn run(name: &str, engine: &dyn Engine, dir: &std::path::Path) {
    let start = Instant::now();
    let mut batch = Vec::with_capacity(BATCH);
    for user in 0..USERS {
        batch.push((store_key(user), 0u64));
        if batch.len() == BATCH {
            engine.write(&batch);
            batch.clear();
        }
    }
    engine.write(&batch);
    batch.clear();
    let load = start.elapsed().as_secs_f64();

    let start = Instant::now();
    let mut pending: HashMap<[u8; 12], u64> = HashMap::with_capacity(BATCH);
    for event in 0..EVENTS {
        let key = store_key(event % USERS);
        let count = match pending.get(&key) {
            Some(count) => *count,
            None => engine.get(&key).unwrap_or(0),
        };
        pending.insert(key, count + 1);
        if pending.len() == BATCH {
            let drained: Vec<_> = pending.drain().collect();
            engine.write(&drained);
        }
    }
    let drained: Vec<_> = pending.drain().collect();
    engine.write(&drained);
    let update = start.elapsed().as_secs_f64();

    let start = Instant::now();
    let (mut entries, mut bytes) = (0, 0);
    for group in 0..GROUPS as u16 {
        let (e, b) = engine.scan(group);
        entries += e;
        bytes += b;
    }
    let scan = start.elapsed().as_secs_f64();
    assert_eq!(entries, USERS);
    let disk: u64 = walk(dir);
    println!(
        "{name:7} load {:.2} M keys/s | update {:.3} M events/s | scan {:.2} s ({:.0} MB/s of entries) | disk {} MB | peak RSS {} MB",
        USERS as f64 / load / 1e6,
        EVENTS as f64 / update / 1e6,
        scan,
        bytes as f64 / scan / 1e6,
        disk >> 20,
        peak_rss_mb(),
    );
}

fn walk(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        total += if path.is_dir() { walk(&path) } else { entry.metadata().map_or(0, |m| m.len()) };
    }
    total
}

fn peak_rss_mb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
        .map_or(0, |kb| kb >> 10)
}

fn main() {
    let engine = std::env::args().nth(1).unwrap_or_default();
    let dir = tempfile::tempdir().unwrap();
    match engine.as_str() {
        "fjall" => {
            let keyspace = fjall::Config::new(dir.path())
                .manual_journal_persist(true)
                .cache_size(32 << 20)
                .max_write_buffer_size(64 << 20)
                .max_journaling_size(128 << 20)
                .open()
                .unwrap();
            let entries = keyspace
                .open_partition(
                    "entries",
                    fjall::PartitionCreateOptions::default()
                        .manual_journal_persist(true)
                        .max_memtable_size(16 << 20)
                        .block_size(std::env::var("BLOCK").ok().and_then(|b| b.parse().ok()).unwrap_or(1024)),
                )
                .unwrap();
            run("fjall", &Fjall { keyspace, entries }, dir.path());
        }
        "rocksdb" => {
            let mut options = rocksdb::Options::default();
            options.create_if_missing(true);
            options.set_db_write_buffer_size(64 << 20);
            options.set_write_buffer_size(16 << 20);
            options.set_prefix_extractor(rocksdb::SliceTransform::create_fixed_prefix(4));
            let mut table = rocksdb::BlockBasedOptions::default();
            table.set_block_cache(&rocksdb::Cache::new_lru_cache(32 << 20));
            table.set_block_size(1024);
            table.set_bloom_filter(10.0, false);
            options.set_block_based_table_factory(&table);
            let db = rocksdb::DB::open(&options, dir.path()).unwrap();
            run("rocksdb", &Rocks { db }, dir.path());
        }
        _ => eprintln!("usage: lsm-engines fjall|rocksdb (one engine per process, so each peak RSS is its own)"),
    }
}
