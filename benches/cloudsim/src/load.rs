//! A load generator for validating the simulator: `concurrency` keep-alive connections, each
//! sending range GETs of one object back to back for a while, timing each response's headers
//! (first byte) and body.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Serialize;

use crate::shaping::splitmix64;

/// What to send.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    /// `host:port` of the server.
    pub addr: String,
    /// `/bucket/key` of the object read.
    pub path: String,
    /// Bytes per GET (the whole object when larger).
    pub range_bytes: u64,
    /// Connections, each with one request at a time.
    pub concurrency: usize,
    /// How long to send.
    pub duration: Duration,
}

/// Milliseconds at a few percentiles.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    fn of(mut ms: Vec<f64>) -> Self {
        if ms.is_empty() {
            return Self::default();
        }
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
        Self {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

/// What came back.
#[derive(Clone, Debug, Serialize)]
pub struct LoadReport {
    /// Responses received in full.
    pub requests: u64,
    /// Wall time of the run, in seconds.
    pub seconds: f64,
    /// Requests per second.
    pub requests_per_s: f64,
    /// Body bytes per second, all connections together.
    pub bytes_per_s: f64,
    /// Body bytes per second of one connection's transfers (body bytes over the time from
    /// first byte to last, median over requests).
    pub conn_bytes_per_s_p50: f64,
    /// Time from sending a request to its response's headers.
    pub first_byte_ms: Percentiles,
    /// Time from sending a request to its body's last byte.
    pub total_ms: Percentiles,
}

struct Sample {
    first_byte: Duration,
    total: Duration,
    bytes: u64,
}

/// Runs the load on a fresh runtime and reports.
pub fn run(spec: &LoadSpec) -> Result<LoadReport> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run_async(spec))
}

async fn run_async(spec: &LoadSpec) -> Result<LoadReport> {
    let size = object_size(spec).await?;
    let t0 = Instant::now();
    let deadline = t0 + spec.duration;
    let mut tasks = Vec::new();
    for i in 0..spec.concurrency {
        let spec = spec.clone();
        tasks.push(tokio::spawn(async move {
            connection(&spec, size, i as u64, deadline).await
        }));
    }
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await??);
    }
    let seconds = t0.elapsed().as_secs_f64();
    let ms = |f: fn(&Sample) -> Duration| {
        samples
            .iter()
            .map(|s| f(s).as_secs_f64() * 1e3)
            .collect::<Vec<_>>()
    };
    let mut rates: Vec<f64> = samples
        .iter()
        .filter_map(|s| {
            let body = s.total.checked_sub(s.first_byte).filter(|d| !d.is_zero())?;
            Some(s.bytes as f64 / body.as_secs_f64())
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    Ok(LoadReport {
        requests: samples.len() as u64,
        seconds,
        requests_per_s: samples.len() as f64 / seconds,
        bytes_per_s: samples.iter().map(|s| s.bytes).sum::<u64>() as f64 / seconds,
        conn_bytes_per_s_p50: rates.get(rates.len() / 2).copied().unwrap_or(0.0),
        first_byte_ms: Percentiles::of(ms(|s| s.first_byte)),
        total_ms: Percentiles::of(ms(|s| s.total)),
    })
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect(addr: &str) -> Result<Sender> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn object_size(spec: &LoadSpec) -> Result<u64> {
    let mut sender = connect(&spec.addr).await?;
    let req = Request::head(&spec.path)
        .header("host", &spec.addr)
        .body(Empty::new())?;
    let resp = sender.send_request(req).await?;
    if !resp.status().is_success() {
        bail!("HEAD {} answered {}", spec.path, resp.status());
    }
    let len = resp
        .headers()
        .get("content-length")
        .context("no Content-Length")?;
    Ok(len.to_str()?.parse()?)
}

async fn connection(spec: &LoadSpec, size: u64, id: u64, deadline: Instant) -> Result<Vec<Sample>> {
    let mut sender = connect(&spec.addr).await?;
    let len = spec.range_bytes.min(size).max(1);
    let mut samples = Vec::new();
    let mut n = 0u64;
    while Instant::now() < deadline {
        n += 1;
        let start = splitmix64(id << 40 | n) % (size - len + 1);
        let req = Request::get(&spec.path)
            .header("host", &spec.addr)
            .header("range", format!("bytes={start}-{}", start + len - 1))
            .body(Empty::new())?;
        let t = Instant::now();
        let resp = sender.send_request(req).await?;
        let first_byte = t.elapsed();
        if !resp.status().is_success() {
            bail!("GET {} answered {}", spec.path, resp.status());
        }
        let bytes = resp.into_body().collect().await?.to_bytes().len() as u64;
        if bytes != len {
            bail!("GET {} returned {bytes} bytes, asked for {len}", spec.path);
        }
        samples.push(Sample {
            first_byte,
            total: t.elapsed(),
            bytes,
        });
    }
    Ok(samples)
}
