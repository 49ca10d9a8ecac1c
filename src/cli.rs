//! The `zcrop` command line: parsing, dispatch, and error reporting as one clear line.
//!
//! [`main`] is the single entry point shared by the Rust binary and the Python console script.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

/// Exit code for a command that ran and failed (bad data, IO error).
pub const EXIT_FAILURE: u8 = 1;
/// Exit code for a usage error (unknown flag, bad argument), as clap reports it.
pub const EXIT_USAGE: u8 = 2;

/// Fast random N-d crops from huge Zarr arrays.
#[derive(Debug, Parser)]
#[command(name = "zcrop", version, about, long_about = None)]
struct Cli {}

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
    match Cli::try_parse_from(args) {
        Ok(Cli {}) => 0,
        Err(err) => {
            // `--help` and `--version` are "errors" to clap but succeed for the user.
            let code = if err.use_stderr() { EXIT_USAGE } else { 0 };
            // A closed stdout (e.g. `zcrop --help | head -0`) must not panic.
            let _ = err.print();
            code
        }
    }
}
