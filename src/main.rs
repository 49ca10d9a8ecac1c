//! The `zcrop` command-line binary. All of its logic lives in [`zcrop::cli`], which the Python
//! console script runs too.

fn main() -> std::process::ExitCode {
    zcrop::cli::main(std::env::args_os())
}
