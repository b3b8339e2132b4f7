//! Where snapshots live: one object-store location (local directory, in-memory, S3) per directory.
//!
//! A [`SnapshotStorage`] is an object store plus a base prefix; every method takes a path
//! relative to that prefix (`"chk-3/_metadata"`), and [`SnapshotStorage::child`] narrows the
//! prefix. All stores are [`object_store`] stores, so a snapshot written to a local directory
//! and one written to S3 are the same bytes under the same relative names.
//!
//! Accepted locations ([`SnapshotStorage::from_url`]):
//!
//! - `file:///absolute/path` (also `file:/absolute/path` and `file://localhost/absolute/path`);
//! - a plain local path, absolute or relative (made absolute against the current directory);
//! - `memory://NAME/prefix`: an in-memory store shared by every storage opened with the same
//!   `NAME` in this process (for tests);
//! - `s3://bucket/prefix`: credentials and region from the usual `AWS_*` environment variables;
//!   `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT`) selects another endpoint (MinIO, moto), which is then
//!   addressed path-style and may be plain `http`.
//!
//! Code on plain threads (subtasks, the job master) reaches the async API through
//! [`io_runtime`] or the [`BlockingStorage`] facade.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::path::{Component, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// The location forms [`SnapshotStorage::from_url`] accepts, for error messages.
pub const ACCEPTED_FORMS: &str = "file:///absolute/path, an absolute or relative local path, \
     memory://NAME[/prefix] (in-process, for tests) or s3://bucket[/prefix]";

/// A failure to reach or use a snapshot location.
///
/// Every message names the full location (storage URL plus relative path) and what to do.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The location string is not one of the accepted forms.
    #[error("unsupported snapshot location '{url}': {reason}; accepted forms: {ACCEPTED_FORMS}")]
    InvalidUrl {
        /// The location as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The object store for a valid location could not be set up (S3 configuration, local directory).
    #[error("cannot open snapshot storage '{url}': {reason}; check the location and its access settings")]
    Setup {
        /// The location as given.
        url: String,
        /// Why it failed.
        reason: String,
    },
    /// The object does not exist.
    #[error("{location} does not exist; check the path (a snapshot directory holds a _metadata file)")]
    NotFound {
        /// The full location of the missing object.
        location: String,
    },
    /// The directory holds no `_metadata`, so it is not a snapshot (refused by dispose).
    #[error(
        "not a weir snapshot directory: no _metadata in {location}; point at a savepoint directory or a retained chk-<n> directory"
    )]
    NotASnapshot {
        /// The directory.
        location: String,
    },
    /// Any other failure of the store.
    #[error("cannot {operation} {location}: {source}; check that the location is reachable and writable")]
    Io {
        /// What was attempted (`read`, `write`, `list`, `delete`, ...).
        operation: &'static str,
        /// The full location.
        location: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// Removing emptied local directories failed.
    #[error("cannot remove directory {location}: {source}; remove it by hand")]
    LocalDir {
        /// The directory.
        location: String,
        /// The file-system error.
        #[source]
        source: std::io::Error,
    },
}

/// A snapshot location: an object store and a base prefix inside it.
///
/// Cheap to clone (the store is shared). Relative paths use `/` as the separator; every
/// segment is taken literally (a `..` segment is stored as an ordinary, escaped name and can
/// never leave the prefix).
#[derive(Clone)]
pub struct SnapshotStorage {
    store: Arc<dyn ObjectStore>,
    /// Set for local directories: the store (for file-system paths) and its root directory.
    local: Option<(Arc<LocalFileSystem>, PathBuf)>,
    prefix: Path,
    url: String,
    display: String,
}

impl fmt::Debug for SnapshotStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotStorage").field("url", &self.url).field("prefix", &self.prefix.as_ref()).finish()
    }
}

impl fmt::Display for SnapshotStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

/// The process-wide in-memory stores, by the authority of their `memory://` URL.
fn memory_store(name: &str) -> Arc<InMemory> {
    static STORES: OnceLock<Mutex<BTreeMap<String, Arc<InMemory>>>> = OnceLock::new();
    let stores = STORES.get_or_init(|| Mutex::new(BTreeMap::new()));
    let mut stores = stores.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    Arc::clone(stores.entry(name.to_string()).or_insert_with(|| Arc::new(InMemory::new())))
}

/// Decodes `%XX` escapes of a `file://` URL path.
fn percent_decode(input: &str) -> Option<String> {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = input.get(index + 1..index + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Joins `/`-separated `relative` onto `prefix`, skipping empty segments.
fn join_path(prefix: &Path, relative: &str) -> Path {
    relative.split('/').filter(|segment| !segment.is_empty()).fold(prefix.clone(), |path, segment| path.join(segment))
}

/// Appends `relative` (trimmed of slashes) to a URL or path string.
fn join_display(base: &str, relative: &str) -> String {
    let relative = relative.trim_matches('/');
    if relative.is_empty() {
        base.to_string()
    } else if base.ends_with('/') {
        format!("{base}{relative}")
    } else {
        format!("{base}/{relative}")
    }
}

/// Makes `path` absolute against the current directory and removes `.` and `..` lexically.
fn normalize_local(url: &str, path: &std::path::Path) -> Result<PathBuf, StorageError> {
    let absolute = std::path::absolute(path).map_err(|error| StorageError::Setup {
        url: url.to_string(),
        reason: format!("cannot make the path absolute: {error}"),
    })?;
    let mut normalized = PathBuf::new();
    for component in absolute.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                normalized.pop();
            }
            other => normalized.push(other.as_os_str()),
        }
    }
    Ok(normalized)
}

impl SnapshotStorage {
    /// Opens the snapshot location `url` (see the module documentation for the accepted forms).
    ///
    /// Nothing is created: a local directory that does not exist yet is created by the first
    /// [`put`](Self::put) below it.
    pub fn from_url(url: &str) -> Result<SnapshotStorage, StorageError> {
        let trimmed = url.trim();
        if trimmed.is_empty() {
            return Err(StorageError::InvalidUrl { url: url.to_string(), reason: "the location is empty".into() });
        }
        if let Some(rest) = trimmed.strip_prefix("file:") {
            let path = if let Some(after) = rest.strip_prefix("//") {
                // file://[authority]/path: only an empty authority or localhost is local.
                let (authority, path) = after.find('/').map_or((after, ""), |slash| after.split_at(slash));
                if !authority.is_empty() && authority != "localhost" {
                    return Err(StorageError::InvalidUrl {
                        url: url.to_string(),
                        reason: format!("file URLs must name a local path, not host '{authority}'"),
                    });
                }
                path
            } else {
                rest
            };
            if !path.starts_with('/') {
                return Err(StorageError::InvalidUrl {
                    url: url.to_string(),
                    reason: "a file URL needs an absolute path (file:///absolute/path)".into(),
                });
            }
            let decoded = percent_decode(path).ok_or_else(|| StorageError::InvalidUrl {
                url: url.to_string(),
                reason: "the path holds an invalid %-escape".into(),
            })?;
            return Self::local(url, std::path::Path::new(&decoded));
        }
        if let Some(rest) = trimmed.strip_prefix("memory://") {
            let (name, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let store: Arc<dyn ObjectStore> = memory_store(name);
            let base = format!("memory://{name}");
            return Ok(SnapshotStorage {
                store,
                local: None,
                prefix: join_path(&Path::default(), prefix),
                url: join_display(&base, prefix),
                display: join_display(&base, prefix),
            });
        }
        if let Some(rest) = trimmed.strip_prefix("s3://") {
            return Self::s3(url, rest);
        }
        if let Some((scheme, _)) = trimmed.split_once("://")
            && !scheme.is_empty()
            && scheme.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'+' | b'-' | b'.'))
        {
            return Err(StorageError::InvalidUrl {
                url: url.to_string(),
                reason: format!("the scheme '{scheme}' is not supported"),
            });
        }
        Self::local(url, std::path::Path::new(trimmed))
    }

    fn local(url: &str, path: &std::path::Path) -> Result<SnapshotStorage, StorageError> {
        let directory = normalize_local(url, path)?;
        // The store is rooted at the deepest directory that exists (LocalFileSystem requires an
        // existing root); the rest becomes the prefix and is created by the first write.
        let Some(root) = directory.ancestors().find(|ancestor| ancestor.is_dir()) else {
            return Err(StorageError::Setup {
                url: url.to_string(),
                reason: format!("no existing directory above {}", directory.display()),
            });
        };
        let remainder = directory.strip_prefix(root).unwrap_or_else(|_| std::path::Path::new(""));
        let mut prefix = Path::default();
        for component in remainder.components() {
            let segment = component.as_os_str().to_str().ok_or_else(|| StorageError::InvalidUrl {
                url: url.to_string(),
                reason: "the path is not valid UTF-8".into(),
            })?;
            prefix = prefix.join(segment);
        }
        let store = LocalFileSystem::new_with_prefix(root)
            .map_err(|error| StorageError::Setup { url: url.to_string(), reason: error.to_string() })?
            .with_fsync(true);
        let store = Arc::new(store);
        let dyn_store: Arc<dyn ObjectStore> = store.clone();
        let display = directory.to_string_lossy().into_owned();
        Ok(SnapshotStorage {
            store: dyn_store,
            local: Some((store, root.to_path_buf())),
            prefix,
            url: format!("file://{display}"),
            display,
        })
    }

    fn s3(url: &str, rest: &str) -> Result<SnapshotStorage, StorageError> {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(StorageError::InvalidUrl {
                url: url.to_string(),
                reason: "an S3 location needs a bucket (s3://bucket/prefix)".into(),
            });
        }
        // reqwest is built without a crypto provider of its own: use ring's.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        let endpoint = std::env::var("AWS_ENDPOINT_URL")
            .ok()
            .or_else(|| std::env::var("AWS_ENDPOINT").ok())
            .filter(|endpoint| !endpoint.trim().is_empty());
        if let Some(endpoint) = endpoint {
            builder =
                builder.with_endpoint(endpoint.trim()).with_allow_http(true).with_virtual_hosted_style_request(false);
        }
        let store = builder.build().map_err(|error| StorageError::Setup {
            url: url.to_string(),
            reason: format!("{error} (S3 settings come from AWS_* environment variables)"),
        })?;
        let base = format!("s3://{bucket}");
        Ok(SnapshotStorage {
            store: Arc::new(store),
            local: None,
            prefix: join_path(&Path::default(), prefix),
            url: join_display(&base, prefix),
            display: join_display(&base, prefix),
        })
    }

    /// The same store with the prefix extended by `relative` (`/`-separated).
    pub fn child(&self, relative: &str) -> SnapshotStorage {
        SnapshotStorage {
            store: Arc::clone(&self.store),
            local: self.local.clone(),
            prefix: join_path(&self.prefix, relative),
            url: join_display(&self.url, relative),
            display: join_display(&self.display, relative),
        }
    }

    /// The same store one directory up (the job's directory of a checkpoint directory);
    /// itself at the store's root.
    pub fn parent(&self) -> SnapshotStorage {
        let parts: Vec<_> = self.prefix.parts().collect();
        let up = |text: &str| -> String {
            let trimmed = text.trim_end_matches('/');
            match trimmed.rsplit_once('/') {
                Some((head, _)) if !head.is_empty() && !head.ends_with('/') => head.to_string(),
                Some((head, _)) => format!("{head}/"),
                None => trimmed.to_string(),
            }
        };
        let Some((_, kept)) = parts.split_last() else {
            // A local store rooted at this very directory: open the parent by its path.
            return SnapshotStorage::from_url(&up(&self.url)).unwrap_or_else(|_| self.clone());
        };
        SnapshotStorage {
            store: Arc::clone(&self.store),
            local: self.local.clone(),
            prefix: Path::from_iter(kept.iter().cloned()),
            url: up(&self.url),
            display: up(&self.display),
        }
    }

    /// The job's `shared/` directory of a checkpoint directory (its sibling), where the data
    /// files of incremental checkpoints live.
    pub fn shared_dir(&self) -> SnapshotStorage {
        self.parent().child(crate::paths::SHARED_DIR)
    }

    /// The directory and name of `file` as a snapshot's blocks name it: relative to this
    /// snapshot directory, or in the job's `shared/` directory
    /// ([`SHARED_FILE_PREFIX`](crate::format::SHARED_FILE_PREFIX)).
    pub fn resolve(&self, file: &str) -> (SnapshotStorage, String) {
        match file.strip_prefix(crate::format::SHARED_FILE_PREFIX) {
            Some(name) => (self.shared_dir(), name.to_string()),
            None => (self.clone(), file.to_string()),
        }
    }

    /// The location as a URL (`file:///...`, `memory://...`, `s3://...`); accepted by [`from_url`](Self::from_url).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The location for people: a plain path for local directories, the URL otherwise; also
    /// accepted by [`from_url`](Self::from_url).
    pub fn display(&self) -> &str {
        &self.display
    }

    /// True for a local directory.
    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// The full location of `relative`, for messages.
    pub fn location(&self, relative: &str) -> String {
        join_display(&self.display, relative)
    }

    fn path(&self, relative: &str) -> Path {
        join_path(&self.prefix, relative)
    }

    fn error(&self, operation: &'static str, relative: &str, source: object_store::Error) -> StorageError {
        let location = self.location(relative);
        match source {
            object_store::Error::NotFound { .. } => StorageError::NotFound { location },
            source => StorageError::Io { operation, location, source },
        }
    }

    /// Writes `bytes` as the object `relative`, replacing it atomically (readers see the old
    /// object or the new one, never a part).
    pub async fn put(&self, relative: &str, bytes: Bytes) -> Result<(), StorageError> {
        self.store
            .put(&self.path(relative), PutPayload::from_bytes(bytes))
            .await
            .map(|_| ())
            .map_err(|error| self.error("write", relative, error))
    }

    /// Reads the whole object `relative`.
    pub async fn get(&self, relative: &str) -> Result<Bytes, StorageError> {
        let result = self.store.get(&self.path(relative)).await.map_err(|error| self.error("read", relative, error))?;
        result.bytes().await.map_err(|error| self.error("read", relative, error))
    }

    /// Reads bytes `range` of the object `relative`.
    pub async fn get_range(&self, relative: &str, range: Range<u64>) -> Result<Bytes, StorageError> {
        self.store.get_range(&self.path(relative), range).await.map_err(|error| self.error("read", relative, error))
    }

    /// Reads several ranges of the object `relative` (the store coalesces nearby ranges).
    pub async fn get_ranges(&self, relative: &str, ranges: &[Range<u64>]) -> Result<Vec<Bytes>, StorageError> {
        self.store.get_ranges(&self.path(relative), ranges).await.map_err(|error| self.error("read", relative, error))
    }

    /// The size in bytes of the object `relative`.
    pub async fn size(&self, relative: &str) -> Result<u64, StorageError> {
        match self.store.head(&self.path(relative)).await {
            Ok(meta) => Ok(meta.size),
            Err(error) => Err(self.error("check", relative, error)),
        }
    }

    /// True when the object `relative` exists.
    pub async fn exists(&self, relative: &str) -> Result<bool, StorageError> {
        match self.store.head(&self.path(relative)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(error) => Err(self.error("check", relative, error)),
        }
    }

    /// Names of the immediate "subdirectories" under the prefix, sorted (none when the prefix
    /// does not exist).
    pub async fn list_dirs(&self) -> Result<Vec<String>, StorageError> {
        let prefix = (!self.prefix.as_ref().is_empty()).then_some(&self.prefix);
        let listing = match self.store.list_with_delimiter(prefix).await {
            Ok(listing) => listing,
            Err(object_store::Error::NotFound { .. }) => return Ok(Vec::new()),
            Err(error) => return Err(self.error("list", "", error)),
        };
        let mut names: Vec<String> =
            listing.common_prefixes.iter().filter_map(|path| path.filename().map(str::to_string)).collect();
        names.sort();
        Ok(names)
    }

    /// Every object under the prefix: (path relative to the prefix, size in bytes).
    pub async fn list_all(&self) -> Result<Vec<(String, u64)>, StorageError> {
        let prefix = (!self.prefix.as_ref().is_empty()).then_some(&self.prefix);
        let listed: Vec<object_store::ObjectMeta> = match self.store.list(prefix).try_collect().await {
            Ok(listed) => listed,
            Err(object_store::Error::NotFound { .. }) => Vec::new(),
            Err(error) => return Err(self.error("list", "", error)),
        };
        let mut objects: Vec<(String, u64)> = listed
            .into_iter()
            .filter_map(|meta| {
                let parts = meta.location.prefix_match(&self.prefix)?;
                let relative = parts.map(|part| part.as_ref().to_string()).collect::<Vec<_>>().join("/");
                Some((relative, meta.size))
            })
            .collect();
        objects.sort();
        Ok(objects)
    }

    /// Total size in bytes of every object under the prefix.
    pub async fn size_of_all(&self) -> Result<u64, StorageError> {
        Ok(self.list_all().await?.iter().map(|(_, size)| size).sum())
    }

    /// Deletes the object `relative` (a missing object is not an error).
    pub async fn delete(&self, relative: &str) -> Result<(), StorageError> {
        match self.store.delete(&self.path(relative)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(self.error("delete", relative, error)),
        }
    }

    /// Deletes everything under the prefix and returns the bytes removed; for a local
    /// directory also removes the emptied directory tree, the prefix directory included.
    pub async fn delete_all(&self) -> Result<u64, StorageError> {
        let objects = self.list_all().await?;
        let mut removed = 0;
        for (relative, size) in &objects {
            self.delete(relative).await?;
            removed += size;
        }
        self.remove_empty_local_dirs()?;
        Ok(removed)
    }

    /// Removes the (now empty) local directory tree of the prefix, bottom-up.
    pub(crate) fn remove_empty_local_dirs(&self) -> Result<(), StorageError> {
        let Some(directory) = self.local_directory() else { return Ok(()) };
        if directory.parent().is_none() {
            // Never try to remove a file-system root.
            return Ok(());
        }
        remove_staging_files(&directory)
            .map_err(|source| StorageError::LocalDir { location: directory.to_string_lossy().into_owned(), source })?;
        remove_empty_dirs(&directory)
            .map_err(|source| StorageError::LocalDir { location: directory.to_string_lossy().into_owned(), source })
    }

    /// The local directory of the prefix, for a local store.
    pub(crate) fn local_directory(&self) -> Option<PathBuf> {
        let (store, root) = self.local.as_ref()?;
        if self.prefix.as_ref().is_empty() {
            return Some(root.clone());
        }
        store.path_to_filesystem(&self.prefix).ok()
    }

    /// Deletes the staging files of unfinished local multipart writes under the prefix (a
    /// no-op for other stores, whose unfinished uploads are invisible and expire).
    pub fn remove_local_staging_files(&self) -> Result<(), StorageError> {
        let Some(directory) = self.local_directory() else { return Ok(()) };
        remove_staging_files(&directory)
            .map_err(|source| StorageError::LocalDir { location: directory.to_string_lossy().into_owned(), source })
    }

    /// A blocking facade over this storage, running on [`io_runtime`].
    pub fn blocking(&self) -> BlockingStorage {
        BlockingStorage::new(self.clone())
    }
}

/// True for the staging file of an unfinished local multipart write (`<name>#<n>`, which
/// `object_store`'s local store writes and renames on completion, and does not list).
fn is_staging_file(name: &str) -> bool {
    name.rsplit_once('#')
        .is_some_and(|(head, n)| !head.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Deletes what unfinished local multipart writes under `directory` left (a process killed
/// while writing, an aborted stream whose upload was not cleaned): nothing lists them, so
/// nothing else would. A write still in progress then fails on completion, which only
/// happens to writes of a snapshot that is being deleted.
fn remove_staging_files(directory: &std::path::Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(directory) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let entry = entry?;
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            remove_staging_files(&entry.path())?;
        } else if file_type.is_file() && entry.file_name().to_str().is_some_and(is_staging_file) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
        }
    }
    Ok(())
}

/// Removes `directory` and its subdirectories if they hold no files; a missing directory is fine.
fn remove_empty_dirs(directory: &std::path::Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(directory) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            remove_empty_dirs(&entry.path())?;
        }
    }
    match std::fs::remove_dir(directory) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        // Something that is not a snapshot object (a stray file) is left in place.
        Err(error) if error.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
            tracing::warn!(directory = %directory.display(), "directory not removed: it still holds files");
            Ok(())
        }
        Err(error) => Err(error),
    }
}

/// The tokio runtime weir uses for storage I/O from plain (non-async) threads: created on
/// first use, multi-threaded with 2 workers named `weir-io`.
///
/// # Panics
///
/// If the operating system refuses to start the runtime's threads on first use; nothing
/// can do storage I/O then.
pub fn io_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        match tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("weir-io").enable_all().build()
        {
            Ok(runtime) => runtime,
            Err(error) => panic!("cannot start weir's storage I/O runtime (threads 'weir-io'): {error}"),
        }
    })
}

/// Synchronous access to a [`SnapshotStorage`] for code on plain threads.
///
/// Each call blocks the calling thread on a runtime handle. Must not be called from inside
/// an async task (tokio panics on a nested `block_on`).
#[derive(Clone, Debug)]
pub struct BlockingStorage {
    /// The storage.
    pub storage: SnapshotStorage,
    /// The runtime the calls run on.
    pub runtime: tokio::runtime::Handle,
}

impl BlockingStorage {
    /// Blocking access to `storage` on [`io_runtime`].
    pub fn new(storage: SnapshotStorage) -> BlockingStorage {
        BlockingStorage { storage, runtime: io_runtime().handle().clone() }
    }

    /// Runs any future (for example [`crate::load_metadata`]) to completion on the runtime.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Blocking [`SnapshotStorage::put`].
    pub fn put(&self, relative: &str, bytes: Bytes) -> Result<(), StorageError> {
        self.block_on(self.storage.put(relative, bytes))
    }

    /// Starts writing the object `relative` as a stream of parts (a multipart upload), for
    /// objects too large to build in memory first. The object appears only when
    /// [`StreamingWrite::finish`] succeeds; dropped before, nothing stays.
    pub fn stream(&self, relative: &str) -> Result<StreamingWrite, StorageError> {
        let upload = self
            .block_on(self.storage.store.put_multipart(&self.storage.path(relative)))
            .map_err(|error| self.storage.error("write", relative, error))?;
        Ok(StreamingWrite {
            write: Some(object_store::WriteMultipart::new_with_chunk_size(upload, STREAM_PART_BYTES)),
            runtime: self.runtime.clone(),
            storage: self.storage.clone(),
            relative: relative.to_string(),
        })
    }

    /// Blocking [`SnapshotStorage::get`].
    pub fn get(&self, relative: &str) -> Result<Bytes, StorageError> {
        self.block_on(self.storage.get(relative))
    }

    /// Blocking [`SnapshotStorage::get_range`].
    pub fn get_range(&self, relative: &str, range: Range<u64>) -> Result<Bytes, StorageError> {
        self.block_on(self.storage.get_range(relative, range))
    }

    /// Blocking [`SnapshotStorage::get_ranges`].
    pub fn get_ranges(&self, relative: &str, ranges: &[Range<u64>]) -> Result<Vec<Bytes>, StorageError> {
        self.block_on(self.storage.get_ranges(relative, ranges))
    }

    /// Blocking [`SnapshotStorage::exists`].
    pub fn exists(&self, relative: &str) -> Result<bool, StorageError> {
        self.block_on(self.storage.exists(relative))
    }

    /// Blocking [`SnapshotStorage::list_dirs`].
    pub fn list_dirs(&self) -> Result<Vec<String>, StorageError> {
        self.block_on(self.storage.list_dirs())
    }

    /// Blocking [`SnapshotStorage::delete`].
    pub fn delete(&self, relative: &str) -> Result<(), StorageError> {
        self.block_on(self.storage.delete(relative))
    }

    /// Blocking [`SnapshotStorage::delete_all`].
    pub fn delete_all(&self) -> Result<u64, StorageError> {
        self.block_on(self.storage.delete_all())
    }

    /// Blocking [`SnapshotStorage::size_of_all`].
    pub fn size_of_all(&self) -> Result<u64, StorageError> {
        self.block_on(self.storage.size_of_all())
    }
}

/// Part size of a [`StreamingWrite`] (S3's minimum part is 5 MiB).
pub const STREAM_PART_BYTES: usize = 8 * 1024 * 1024;

/// Parts of a [`StreamingWrite`] in flight at once: the memory a stream holds is about
/// this many parts.
const STREAM_PARTS_IN_FLIGHT: usize = 2;

/// An object being written part by part ([`BlockingStorage::stream`]).
pub struct StreamingWrite {
    write: Option<object_store::WriteMultipart>,
    runtime: tokio::runtime::Handle,
    storage: SnapshotStorage,
    relative: String,
}

impl StreamingWrite {
    /// Appends `bytes`, waiting while too many parts are in flight.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), StorageError> {
        let Some(write) = self.write.as_mut() else { return Ok(()) };
        self.runtime
            .block_on(write.wait_for_capacity(STREAM_PARTS_IN_FLIGHT))
            .map_err(|error| self.storage.error("write", &self.relative, error))?;
        // Uploads of full parts start on the runtime.
        let _context = self.runtime.enter();
        write.write(bytes);
        Ok(())
    }

    /// Appends `bytes` without copying them.
    pub fn put(&mut self, bytes: Bytes) -> Result<(), StorageError> {
        let Some(write) = self.write.as_mut() else { return Ok(()) };
        self.runtime
            .block_on(write.wait_for_capacity(STREAM_PARTS_IN_FLIGHT))
            .map_err(|error| self.storage.error("write", &self.relative, error))?;
        let _context = self.runtime.enter();
        write.put(bytes);
        Ok(())
    }

    /// Writes what is left and completes the object.
    pub fn finish(mut self) -> Result<(), StorageError> {
        let Some(write) = self.write.take() else { return Ok(()) };
        let _context = self.runtime.enter();
        self.runtime
            .block_on(write.finish())
            .map(|_| ())
            .map_err(|error| self.storage.error("write", &self.relative, error))
    }
}

impl Drop for StreamingWrite {
    fn drop(&mut self) {
        if let Some(write) = self.write.take() {
            let _ = self.runtime.block_on(write.abort());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_directory_is_the_sibling_of_a_checkpoint_directory_however_it_was_opened() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("job");
        std::fs::create_dir_all(job.join("chk-5")).unwrap();
        // Opened as an existing directory (the store is rooted at it), as a file URL, and as
        // a child of the checkpoints root.
        let direct = SnapshotStorage::from_url(job.join("chk-5").to_str().unwrap()).unwrap();
        let url = SnapshotStorage::from_url(&format!("file://{}/chk-5", job.display())).unwrap();
        let child = SnapshotStorage::from_url(dir.path().to_str().unwrap()).unwrap().child("job/chk-5");
        for storage in [direct, url, child] {
            let shared = storage.shared_dir().blocking();
            shared.put("chk-5-task-0-0.state", Bytes::from_static(b"x")).unwrap();
            assert!(job.join("shared/chk-5-task-0-0.state").is_file(), "{}", storage.url());
            std::fs::remove_file(job.join("shared/chk-5-task-0-0.state")).unwrap();
            let (resolved, name) = storage.resolve("../shared/chk-5-task-0-0.state");
            assert_eq!(name, "chk-5-task-0-0.state");
            assert_eq!(resolved.display(), job.join("shared").to_str().unwrap());
        }
        let memory = SnapshotStorage::from_url("memory://shared-test/job/chk-5").unwrap();
        assert_eq!(memory.shared_dir().url(), "memory://shared-test/job/shared");
        assert_eq!(memory.resolve("task-1-0.state").1, "task-1-0.state");
    }

    #[test]
    fn a_streamed_object_appears_whole_on_finish_and_not_at_all_when_dropped() {
        {
            let dir = tempfile::tempdir().unwrap();
            let storage = SnapshotStorage::from_url(&format!("file://{}", dir.path().display())).unwrap().blocking();
            let part = vec![7u8; STREAM_PART_BYTES + 123];
            let mut stream = storage.stream("chk-1/task-0-0.state").unwrap();
            stream.write(b"head").unwrap();
            stream.put(Bytes::from(part.clone())).unwrap();
            stream.put(Bytes::from_static(b"tail")).unwrap();
            assert!(!storage.exists("chk-1/task-0-0.state").unwrap(), "visible before finish");
            stream.finish().unwrap();
            let bytes = storage.get("chk-1/task-0-0.state").unwrap();
            assert_eq!(bytes.len(), 4 + part.len() + 4);
            assert_eq!(&bytes[..4], b"head");
            assert_eq!(&bytes[bytes.len() - 4..], b"tail");

            let mut dropped = storage.stream("chk-2/task-0-0.state").unwrap();
            dropped.put(Bytes::from(part)).unwrap();
            drop(dropped);
            assert!(!storage.exists("chk-2/task-0-0.state").unwrap(), "a dropped stream left its object");
            let left: Vec<_> = std::fs::read_dir(dir.path().join("chk-2"))
                .map(|d| d.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            assert!(left.is_empty(), "a dropped stream left {left:?}");
        }
    }

    async fn exercise(storage: &SnapshotStorage) {
        let job = storage.child("job-a");
        job.put("chk-1/_metadata", Bytes::from_static(b"meta-1")).await.unwrap();
        job.put("chk-1/task-0-0.state", Bytes::from_static(b"0123456789")).await.unwrap();
        job.put("chk-2/_metadata", Bytes::from_static(b"meta-2")).await.unwrap();
        assert_eq!(job.get("chk-1/_metadata").await.unwrap(), Bytes::from_static(b"meta-1"));
        assert_eq!(job.get_range("chk-1/task-0-0.state", 2..5).await.unwrap(), Bytes::from_static(b"234"));
        let ranges = job.get_ranges("chk-1/task-0-0.state", &[0..1, 8..10]).await.unwrap();
        assert_eq!(ranges, vec![Bytes::from_static(b"0"), Bytes::from_static(b"89")]);
        assert!(job.exists("chk-2/_metadata").await.unwrap());
        assert!(!job.exists("chk-3/_metadata").await.unwrap());
        assert_eq!(job.list_dirs().await.unwrap(), vec!["chk-1".to_string(), "chk-2".to_string()]);
        assert_eq!(storage.list_dirs().await.unwrap(), vec!["job-a".to_string()]);
        assert_eq!(job.size_of_all().await.unwrap(), 22);
        // Overwrite replaces.
        job.put("chk-2/_metadata", Bytes::from_static(b"meta-2b")).await.unwrap();
        assert_eq!(job.child("chk-2").get("_metadata").await.unwrap(), Bytes::from_static(b"meta-2b"));

        match job.get("chk-9/_metadata").await {
            Err(StorageError::NotFound { location }) => {
                assert!(location.ends_with("job-a/chk-9/_metadata"), "{location}");
                assert!(location.starts_with(storage.display()), "{location}");
            }
            other => panic!("expected NotFound, got {other:?}"),
        }

        let chk1 = job.child("chk-1");
        assert_eq!(chk1.delete_all().await.unwrap(), 16);
        assert_eq!(job.list_dirs().await.unwrap(), vec!["chk-2".to_string()]);
        assert!(!chk1.exists("_metadata").await.unwrap());
        // A prefix that does not exist lists nothing and deletes nothing.
        assert!(storage.child("nothing-here").list_dirs().await.unwrap().is_empty());
        assert_eq!(storage.child("nothing-here").delete_all().await.unwrap(), 0);
        assert_eq!(storage.delete_all().await.unwrap(), 7);
        assert!(storage.list_dirs().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn memory_store_round_trip() {
        let storage = SnapshotStorage::from_url("memory://storage-tests/base").unwrap();
        assert_eq!(storage.url(), "memory://storage-tests/base");
        exercise(&storage).await;
    }

    #[tokio::test]
    async fn memory_stores_are_shared_by_name() {
        let a = SnapshotStorage::from_url("memory://shared-by-name").unwrap();
        let b = SnapshotStorage::from_url("memory://shared-by-name/").unwrap();
        let other = SnapshotStorage::from_url("memory://another-name").unwrap();
        a.put("x/y", Bytes::from_static(b"1")).await.unwrap();
        assert_eq!(b.get("x/y").await.unwrap(), Bytes::from_static(b"1"));
        assert!(!other.exists("x/y").await.unwrap());
    }

    #[tokio::test]
    async fn local_directory_round_trip() {
        let temp = tempfile::tempdir().unwrap();
        let base = temp.path().join("not/yet/there");
        let storage = SnapshotStorage::from_url(base.to_str().unwrap()).unwrap();
        // Opening creates nothing.
        assert!(!base.exists());
        assert!(storage.is_local());
        assert_eq!(storage.display(), base.to_str().unwrap());
        exercise(&storage).await;
        // The emptied tree is gone, the temp dir stays.
        assert!(!base.exists());
        assert!(temp.path().join("not/yet").exists());
    }

    #[tokio::test]
    async fn file_urls_and_relative_segments() {
        let temp = tempfile::tempdir().unwrap();
        let url = format!("file://{}/a/../b", temp.path().display());
        let storage = SnapshotStorage::from_url(&url).unwrap();
        storage.put("f", Bytes::from_static(b"x")).await.unwrap();
        assert!(temp.path().join("b/f").is_file());
        let again = SnapshotStorage::from_url(storage.url()).unwrap();
        assert_eq!(again.get("f").await.unwrap(), Bytes::from_static(b"x"));
        let plain = SnapshotStorage::from_url(storage.display()).unwrap();
        assert_eq!(plain.get("f").await.unwrap(), Bytes::from_static(b"x"));
        // A `..` inside a relative name cannot escape the prefix.
        storage.child("c").put("../escape", Bytes::from_static(b"y")).await.unwrap();
        assert!(!temp.path().join("b/escape").exists());
    }

    #[test]
    fn bad_urls_name_the_location_and_the_accepted_forms() {
        for bad in ["", "gs://bucket/x", "file://otherhost/x", "file:relative", "s3://"] {
            let error = SnapshotStorage::from_url(bad).unwrap_err().to_string();
            assert!(error.contains(&format!("'{bad}'")), "{error}");
            assert!(error.contains("s3://bucket"), "{error}");
        }
    }

    #[test]
    fn s3_urls_build_without_network() {
        let storage = SnapshotStorage::from_url("s3://my-bucket/checkpoints/").unwrap();
        assert_eq!(storage.url(), "s3://my-bucket/checkpoints");
        assert_eq!(storage.child("job/chk-1").url(), "s3://my-bucket/checkpoints/job/chk-1");
    }

    #[test]
    fn blocking_facade_works_from_plain_threads() {
        let storage = SnapshotStorage::from_url("memory://blocking-tests").unwrap().blocking();
        storage.put("a/b", Bytes::from_static(b"abc")).unwrap();
        assert_eq!(storage.get("a/b").unwrap(), Bytes::from_static(b"abc"));
        assert_eq!(storage.get_range("a/b", 1..3).unwrap(), Bytes::from_static(b"bc"));
        assert!(storage.exists("a/b").unwrap());
        assert_eq!(storage.list_dirs().unwrap(), vec!["a".to_string()]);
        assert_eq!(storage.size_of_all().unwrap(), 3);
        assert_eq!(storage.delete_all().unwrap(), 3);
        assert!(!storage.exists("a/b").unwrap());
    }
}
