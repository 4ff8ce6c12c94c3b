//! The `ratemesh` binary: the command line lives in `cli`.

mod cli;

/// mimalloc: glibc's allocator grows and trims the worker threads' arenas request after
/// request under load (`sysmalloc`, `madvise`); mimalloc keeps per-thread free lists.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
