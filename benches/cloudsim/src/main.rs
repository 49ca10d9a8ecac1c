//! `zcrop-cloudsim serve`: the simulator on a port; `zcrop-cloudsim load`: a load generator to
//! validate it. See the library's documentation.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use zcrop_cloudsim::load::{LoadSpec, run};
use zcrop_cloudsim::{Server, Shaping};

#[derive(Parser)]
#[command(
    name = "zcrop-cloudsim",
    about = "A loopback object store with cloud-like latency and bandwidth"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the buckets (directories) under --root; prints `{"endpoint": URL}` once listening.
    Serve(Serve),
    /// Send range GETs of one object from many connections and print what came back (JSON).
    Load(Load),
}

#[derive(Args)]
struct Serve {
    /// The directory whose subdirectories are the buckets.
    #[arg(long)]
    root: PathBuf,
    /// Address to listen on (port 0: a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Runtime threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Exit when standard input closes (so a parent that dies takes the server with it).
    #[arg(long)]
    exit_with_stdin: bool,
    #[command(flatten)]
    shaping: ShapingArgs,
}

#[derive(Args)]
struct ShapingArgs {
    /// Fixed first-byte latency, milliseconds.
    #[arg(long, default_value_t = 0.0)]
    latency_ms: f64,
    /// Uniform jitter added to it, milliseconds.
    #[arg(long, default_value_t = 0.0)]
    jitter_ms: f64,
    /// Share of requests (0-1) that wait --tail-factor times longer.
    #[arg(long, default_value_t = 0.0)]
    tail_fraction: f64,
    /// How much longer a tail request waits.
    #[arg(long, default_value_t = 10.0)]
    tail_factor: f64,
    /// Bandwidth cap per connection, MB/s (10^6 bytes); 0 for none.
    #[arg(long, default_value_t = 0.0)]
    conn_mb_s: f64,
    /// Bandwidth cap of the whole server, MB/s (10^6 bytes); 0 for none.
    #[arg(long, default_value_t = 0.0)]
    total_mb_s: f64,
    /// Seed of the latency draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Args)]
struct Load {
    /// The server, `host:port`.
    #[arg(long)]
    addr: String,
    /// The object, `/bucket/key`.
    #[arg(long)]
    path: String,
    /// Bytes per GET.
    #[arg(long, default_value_t = 65536)]
    range_bytes: u64,
    /// Connections, one request in flight each.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Serve(s) => serve(s),
        Command::Load(l) => {
            let report = run(&LoadSpec {
                addr: l.addr,
                path: l.path,
                range_bytes: l.range_bytes,
                concurrency: l.concurrency,
                duration: Duration::from_secs_f64(l.seconds),
            })?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
    }
}

fn serve(s: Serve) -> Result<()> {
    let a = s.shaping;
    let shaping = Shaping {
        latency_ms: a.latency_ms,
        jitter_ms: a.jitter_ms,
        tail_fraction: a.tail_fraction,
        tail_factor: a.tail_factor,
        conn_bytes_per_s: a.conn_mb_s * 1e6,
        total_bytes_per_s: a.total_mb_s * 1e6,
        seed: a.seed,
    };
    if !s.root.is_dir() {
        anyhow::bail!("--root {} is not a directory", s.root.display());
    }
    let server =
        Server::start(&s.root, s.listen, shaping, s.threads).context("starting the server")?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}",
        serde_json::json!({ "endpoint": server.endpoint() })
    )?;
    out.flush()?;
    drop(out);
    if s.exit_with_stdin {
        // Read until EOF: the parent closed our stdin or died.
        for line in std::io::stdin().lock().lines() {
            if line.is_err() {
                break;
            }
        }
        return Ok(());
    }
    server.wait();
    Ok(())
}
