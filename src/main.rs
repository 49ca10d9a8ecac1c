//! The `zcrop` command-line binary. All of its logic lives in [`zcrop::cli`], which the Python
//! console script runs too.

/// mimalloc, not glibc's malloc: reads hand their buffers (and `Bytes` headers) from IO threads
/// to the consumer, and glibc frees memory allocated by another thread slowly (its arena lock and
/// consolidation). The Python module uses it too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    zcrop::cli::main(std::env::args_os())
}
