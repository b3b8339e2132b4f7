//! The `weir` binary: the command line over the built-in job catalog.

// Records are allocated by one subtask thread and freed by another; mimalloc handles that
// pattern far better than glibc's allocator (measured: wordcount 100 MB, see BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    weir_cli::main_with(weir_jobs::builtin_catalog())
}
