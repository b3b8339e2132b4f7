//! weir's built-in jobs, the ones `weir jobs` lists: `wordcount` (bounded), `counter`
//! (the lessons' running count per user) and `nexmark` (the streaming benchmark's queries).
//!
//! A user's own binary starts from [`builtin_catalog`] and registers its jobs next to these.
#![warn(missing_docs)]

pub mod counter;
pub mod kafka;
pub mod nexmark;
pub mod output;
pub mod wordcount;

use weir_api::catalog::JobCatalog;

/// The catalog with every built-in job.
pub fn builtin_catalog() -> JobCatalog {
    let mut catalog = JobCatalog::new();
    catalog.register(wordcount::WordCount);
    catalog.register(counter::Counter);
    catalog.register(nexmark::Nexmark);
    catalog
}
