//! The `zcrop` command line: parsing, dispatch, and error reporting as one clear line.
//!
//! [`main`] is the single entry point shared by the Rust binary and the Python console script.

mod args;
mod bench;
mod info;

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Parser;

use self::args::{BenchMode, Cli, Command};
use self::bench::{bench_array, bench_io, bench_loader};

/// Exit code for a command that ran and failed (bad data, IO error).
pub const EXIT_FAILURE: u8 = 1;

/// Exit code for a usage error (unknown flag, bad argument), as clap reports it.
pub const EXIT_USAGE: u8 = 2;

/// Runs the CLI on `args` (the program name first, as `std::env::args_os` gives them) and returns
/// the process exit code. Never panics on bad input; errors are printed as one line on stderr.
pub fn main<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    ExitCode::from(main_code(args))
}

/// [`main`], returning the exit code as a number (for the Python console script).
pub fn main_code<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            // `--help` and `--version` are "errors" to clap but succeed for the user.
            let code = if err.use_stderr() { EXIT_USAGE } else { 0 };
            // A closed stdout (e.g. `zcrop --help | head -0`) must not panic.
            let _ = err.print();
            return code;
        }
    };
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_target(false)
        .try_init();
    match run(cli) {
        Ok(()) => 0,
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) => {
            // One line: the error and its causes.
            let _ = writeln!(std::io::stderr(), "zcrop: error: {e:#}");
            EXIT_FAILURE
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// Writes `text` to stdout (a closed pipe surfaces as an error the caller treats as success).
fn emit(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        None => emit(
            "zcrop: fast random crops from Zarr arrays. Try `zcrop --help`, `zcrop bench` or `zcrop info PATH`.\n",
        ),
        Some(Command::Info {
            path,
            json,
            storage_options,
        }) => emit(&info::run_with(&path, &storage_options, json)?),
        Some(Command::Bench(b)) => match b.mode {
            Some(BenchMode::Io(args)) => bench_io(&args),
            Some(BenchMode::Loader(args)) => bench_loader(&args),
            None => bench_array(&b.array),
        },
    }
}

fn configure_threads(threads: Option<usize>) -> Result<()> {
    if let Some(n) = threads {
        if n == 0 {
            bail!("--threads must be at least 1");
        }
        if rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .is_err()
            && rayon::current_num_threads() != n
        {
            log::warn!(
                "decode thread pool already started with {} threads",
                rayon::current_num_threads()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bench_arguments_parse() {
        let cli = Cli::try_parse_from([
            "zcrop",
            "bench",
            "--crop",
            "1,2,3",
            "--batch-size",
            "4",
            "--dataset-size",
            "1G",
        ])
        .unwrap();
        let Some(Command::Bench(b)) = cli.command else {
            panic!()
        };
        assert!(b.mode.is_none());
        assert_eq!(b.array.crop.map(|c| c.0), Some(vec![1, 2, 3]));
        assert_eq!(b.array.dataset_size, 1 << 30);
        let cli = Cli::try_parse_from([
            "zcrop",
            "bench",
            "io",
            "--block-size",
            "64K",
            "--queue-depth",
            "32",
            "--cold",
        ])
        .unwrap();
        let Some(Command::Bench(b)) = cli.command else {
            panic!()
        };
        let Some(BenchMode::Io(io)) = b.mode else {
            panic!()
        };
        assert_eq!(
            (io.block_size, io.io.queue_depth, io.io.cold),
            (65536, 32, true)
        );
        assert!(Cli::try_parse_from(["zcrop", "bench", "--crop", "1,x"]).is_err());
        assert!(Cli::try_parse_from(["zcrop", "bench", "--backend", "nope"]).is_err());
    }
}
