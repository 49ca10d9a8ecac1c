//! The benchmarks behind `zcrop bench`: random-crop throughput of a Zarr array
//! ([`array`](mod@array)), random reads through io-core against the same reads from the page
//! cache ([`io`]), the loader against direct batch reads ([`loader`]), the synthetic datasets
//! they read ([`synth`]), and what they share (CPU time, percentiles, the page cache).

pub mod array;
pub mod io;
pub mod loader;
pub mod synth;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};

/// CPU time (user + system) of this process, from `/proc/self/stat` (in USER_HZ = 100 ticks,
/// fixed by the Linux ABI); `None` elsewhere.
pub fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// Drops the page cache (`sync; echo 1 > /proc/sys/vm/drop_caches`) when permitted; returns why
/// not otherwise.
pub fn drop_page_cache() -> Result<(), String> {
    let status = std::process::Command::new("sync").status();
    if !status.is_ok_and(|s| s.success()) {
        return Err("`sync` failed".into());
    }
    std::fs::write("/proc/sys/vm/drop_caches", b"1").map_err(|e| {
        format!("cannot write /proc/sys/vm/drop_caches ({e}); run as root to measure a cold cache")
    })
}

/// Percentile of sorted `v` (nearest rank).
fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// A progress bar on stderr when it is a terminal and `enabled`.
pub fn progress_bar(
    enabled: bool,
    len: Option<u64>,
    duration: Option<Duration>,
    unit: &str,
) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !enabled || !std::io::stderr().is_terminal() {
        return None;
    }
    let (len, template) = match (len, duration) {
        (Some(n), _) => (n, format!("{{bar:40}} {{pos}}/{{len}} {unit} {{elapsed}}")),
        (None, Some(d)) => (d.as_secs().max(1), "{bar:40} {pos}/{len} s".to_string()),
        (None, None) => (0, "{spinner} {elapsed}".to_string()),
    };
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    Some(bar)
}

/// Reads every file under `root` once, so that a warm run finds the whole dataset in the page
/// cache rather than only what earlier runs happened to read. `Ok(Err(why))` when it does not:
/// the files exceed half the memory available (they would not stay cached). Shows a progress
/// bar (MB read) when `progress`.
fn prewarm_tree(
    root: &std::path::Path,
    progress: bool,
) -> Result<std::result::Result<u64, String>> {
    fn files(dir: &std::path::Path, out: &mut Vec<(PathBuf, u64)>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                files(&entry.path(), out)?;
            } else if kind.is_file() {
                out.push((entry.path(), entry.metadata()?.len()));
            }
        }
        Ok(())
    }
    let mut all = Vec::new();
    if root.is_dir() {
        files(root, &mut all).with_context(|| format!("listing {}", root.display()))?;
    }
    let total: u64 = all.iter().map(|(_, n)| n).sum();
    let Some(available) = mem_available() else {
        return Ok(Err("available memory unknown".into()));
    };
    if total > available / 2 {
        return Ok(Err(format!(
            "the array's {} exceed half the available memory ({})",
            human_bytes(total),
            human_bytes(available)
        )));
    }
    let bar = progress_bar(
        progress,
        Some(total.div_ceil(1_000_000)),
        None,
        "MB pre-read",
    );
    let mut read = 0;
    for (file, _) in &all {
        read += read_through(file)?;
        if let Some(b) = &bar {
            b.set_position(read / 1_000_000);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(Ok(read))
}

/// Reads the file at `path` once (into the page cache); returns its length.
fn read_through(path: &std::path::Path) -> Result<u64> {
    let mut f = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
    std::io::copy(&mut f, &mut std::io::sink())
        .with_context(|| format!("reading {}", path.display()))
}

/// `MemAvailable` of /proc/meminfo, bytes.
fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `n` bytes in decimal units (`1.5 MB`).
pub fn human_bytes(n: u64) -> String {
    scaled(n, 1000.0, &["B", "KB", "MB", "GB", "TB", "PB"])
}

/// `n` in the largest of `units` (each `step` times the one before) that keeps it at least 1.
pub fn scaled(n: u64, step: f64, units: &[&str]) -> String {
    let mut v = n as f64;
    let mut u = 0;
    while v >= step && u + 1 < units.len() {
        v /= step;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::float_cmp)] // exact: the values are small integers
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert!(percentile(&[], 50.0).is_nan());
        assert!(cpu_time().is_some());
    }
}
