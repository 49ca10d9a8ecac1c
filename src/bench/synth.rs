//! Synthetic benchmark datasets: smooth fields plus noise (so they compress like real imagery),
//! written with zarrs into a folder that later runs reuse. The one generator of `zcrop bench`,
//! the criterion benchmarks and the loader benchmark.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rayon::prelude::*;
use zarrs::array::codec::{
    BloscCodec, BloscCompressionLevel, BloscCompressor, BloscShuffleMode, ZstdCodec,
};
use zarrs::array::{Array, ArrayBuilder, ArrayMetadata, BytesToBytesCodecTraits, data_type};
use zarrs::filesystem::FilesystemStore;

/// The compressor of a synthetic dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Codec {
    /// zstd, level 1.
    Zstd,
    /// blosc with lz4 and byte shuffle.
    BloscLz4,
}

/// How a synthetic dataset is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Layout {
    /// Zarr v3, shards of (16, C, 512, 512) holding inner chunks of (1, 1, 128, 128).
    Sharded,
    /// Zarr v2, unsharded chunks of (1, 1, 256, 256).
    V2,
}

/// A synthetic uint16 dataset of shape (T, C, Y, X).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Spec {
    /// Array shape.
    pub shape: [u64; 4],
    /// Compressor.
    pub codec: Codec,
    /// Layout.
    pub layout: Layout,
    /// Seed of the noise.
    pub seed: u64,
    /// Storage chunk: the shard (sharded layout) or the chunk (v2).
    pub storage_chunk: [u64; 4],
    /// Inner chunk of a shard (sharded layout only).
    pub inner_chunk: [u64; 4],
}

/// Channels, rows and columns of the default dataset; its length in time follows the size.
const CHANNELS: u64 = 12;
const SIDE: u64 = 1024;
/// Inner chunk of the sharded layout.
const INNER_CHUNK: [u64; 4] = [1, 1, 128, 128];

impl Layout {
    /// The storage chunk of a dataset with `channels` channels in this layout.
    fn default_storage_chunk(self, channels: u64) -> [u64; 4] {
        match self {
            Layout::Sharded => [16, channels, 512, 512],
            Layout::V2 => [1, 1, 256, 256],
        }
    }
}

impl Spec {
    /// A dataset of `shape` with its layout's default chunking (see [`Layout`]) and seed 42.
    pub fn new(shape: [u64; 4], codec: Codec, layout: Layout) -> Spec {
        Spec {
            shape,
            codec,
            layout,
            seed: 42,
            storage_chunk: layout.default_storage_chunk(shape[1]),
            inner_chunk: INNER_CHUNK,
        }
    }

    /// A dataset of about `bytes` uncompressed bytes: (T, 12, 1024, 1024) uint16, T a multiple
    /// of 16 (the shard length in time).
    pub fn with_size(bytes: u64, codec: Codec, layout: Layout) -> Spec {
        let per_t = CHANNELS * SIDE * SIDE * 2;
        let t = (bytes / per_t).div_ceil(16).max(1) * 16;
        Spec::new([t, CHANNELS, SIDE, SIDE], codec, layout)
    }

    /// The same dataset with a shard of `shard` holding inner chunks of `inner` (sharded layout),
    /// or chunks of `shard` (v2).
    #[must_use]
    pub fn chunked(self, shard: [u64; 4], inner: [u64; 4]) -> Spec {
        Spec {
            storage_chunk: shard,
            inner_chunk: inner,
            ..self
        }
    }

    /// Uncompressed size in bytes.
    pub fn bytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * 2
    }

    /// A folder name that identifies the dataset, so a run with the same spec reuses it. The
    /// layout's default chunking is left out of the name.
    pub fn dir_name(&self) -> String {
        let codec = match self.codec {
            Codec::Zstd => "zstd1",
            Codec::BloscLz4 => "blosclz4",
        };
        let layout = match self.layout {
            Layout::Sharded => "v3sharded",
            Layout::V2 => "v2",
        };
        let dims = |d: [u64; 4]| d.map(|n| n.to_string()).join("x");
        let mut chunking = String::new();
        if self.storage_chunk != self.layout.default_storage_chunk(self.shape[1]) {
            chunking = chunking + "_c" + &dims(self.storage_chunk);
        }
        if self.layout == Layout::Sharded && self.inner_chunk != INNER_CHUNK {
            chunking = chunking + "_i" + &dims(self.inner_chunk);
        }
        format!(
            "u16_{}_{layout}_{codec}{chunking}_s{}.zarr",
            dims(self.shape),
            self.seed
        )
    }
}

/// Default folder of generated datasets: `$ZCROP_BENCH_DATA`, else `<tmp>/zcrop-bench-data`.
pub fn default_data_dir() -> PathBuf {
    std::env::var_os("ZCROP_BENCH_DATA").map_or_else(
        || std::env::temp_dir().join("zcrop-bench-data"),
        PathBuf::from,
    )
}

/// Value of element (t, c, y, x): a smooth field that drifts over time, per-channel offsets and
/// amplitudes, and 5 bits of uniform noise from a generator seeded per row, so any chunk can be
/// written on its own. Deterministic in `seed`.
fn row(spec: &Spec, time: u64, chan: u64, line: u64, out: &mut [u16]) {
    let base = 2000.0 + 600.0 * chan as f64;
    let amp = 400.0 + 50.0 * chan as f64;
    let phase = 0.07 * time as f64 + 0.9 * chan as f64;
    let yf = (line as f64 * 0.011 + phase).sin();
    let mut rng = StdRng::seed_from_u64(spec.seed ^ (time << 48) ^ (chan << 40) ^ (line << 20));
    for (x, v) in out.iter_mut().enumerate() {
        let xf = (x as f64 * 0.008 - phase).cos();
        let noise = f64::from(rng.random::<u32>() & 31) - 16.0;
        let val = base + amp * (yf * xf) + 0.5 * amp * yf + noise;
        *v = val.clamp(0.0, 65535.0) as u16;
    }
}

/// Writes the dataset into `dir/<name>` unless a finished copy is there; returns its path.
/// Calls `progress(done, total)` after each storage chunk.
pub fn ensure(spec: &Spec, dir: &Path, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<PathBuf> {
    let path = dir.join(spec.dir_name());
    let done_marker = path.join(".zcrop-complete");
    if done_marker.exists() {
        return Ok(path);
    }
    if path.exists() {
        std::fs::remove_dir_all(&path)
            .with_context(|| format!("removing unfinished {}", path.display()))?;
    }
    std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
    let store = Arc::new(
        FilesystemStore::new(&path).with_context(|| format!("opening {}", path.display()))?,
    );
    let compressor: Arc<dyn BytesToBytesCodecTraits> = match spec.codec {
        Codec::Zstd => Arc::new(ZstdCodec::new(1, false)),
        Codec::BloscLz4 => Arc::new(
            BloscCodec::new(
                BloscCompressor::LZ4,
                BloscCompressionLevel::try_from(5u8).map_err(|e| anyhow::anyhow!("{e}"))?,
                None,
                BloscShuffleMode::Shuffle,
                Some(2),
            )
            .map_err(|e| anyhow::anyhow!("blosc: {e}"))?,
        ),
    };
    let chunk = spec.storage_chunk;
    let array: Array<FilesystemStore> = match spec.layout {
        Layout::Sharded => {
            let mut b = ArrayBuilder::new(
                spec.shape.to_vec(),
                chunk.to_vec(),
                data_type::uint16(),
                0u16,
            );
            b.subchunk_shape(spec.inner_chunk.to_vec());
            b.bytes_to_bytes_codecs(vec![compressor]);
            b.dimension_names(Some(["time", "channel", "y", "x"]));
            b.build(Arc::clone(&store), "/")?
        }
        Layout::V2 => {
            let compressor = match spec.codec {
                Codec::Zstd => serde_json::json!({"id": "zstd", "level": 1}),
                Codec::BloscLz4 => {
                    serde_json::json!({"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0})
                }
            };
            let md = serde_json::json!({
                "zarr_format": 2, "shape": spec.shape, "chunks": chunk, "dtype": "<u2",
                "compressor": compressor, "fill_value": 0, "order": "C", "filters": null,
                "dimension_separator": "/",
            });
            let md: ArrayMetadata = serde_json::from_value(md)?;
            Array::new_with_metadata(Arc::clone(&store), "/", md)?
        }
    };
    array.store_metadata()?;
    let grid: Vec<u64> = spec
        .shape
        .iter()
        .zip(chunk)
        .map(|(s, c)| s.div_ceil(c))
        .collect();
    let total: u64 = grid.iter().product();
    let done = std::sync::atomic::AtomicU64::new(0);
    (0..total).into_par_iter().try_for_each(|i| -> Result<()> {
        let idx = [
            i / (grid[1] * grid[2] * grid[3]),
            (i / (grid[2] * grid[3])) % grid[1],
            (i / grid[3]) % grid[2],
            i % grid[3],
        ];
        let mut data = vec![0u16; chunk.iter().product::<u64>() as usize];
        // One full array row per chunk row, then the chunk's part of it.
        let mut full = vec![0u16; spec.shape[3] as usize];
        let x0 = (idx[3] * chunk[3]) as usize;
        for (row_no, out) in data.chunks_exact_mut(chunk[3] as usize).enumerate() {
            let row_no = row_no as u64;
            let time = idx[0] * chunk[0] + row_no / (chunk[1] * chunk[2]);
            let chan = idx[1] * chunk[1] + (row_no / chunk[2]) % chunk[1];
            let line = idx[2] * chunk[2] + row_no % chunk[2];
            if time < spec.shape[0] && chan < spec.shape[1] && line < spec.shape[2] {
                row(spec, time, chan, line, &mut full);
                let n = out.len().min(full.len().saturating_sub(x0));
                out[..n].copy_from_slice(&full[x0..x0 + n]);
            }
        }
        array.store_chunk(&idx, data)?;
        let d = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        progress(d, total);
        Ok(())
    })?;
    std::fs::write(&done_marker, serde_json::to_vec_pretty(spec)?)?;
    Ok(path)
}

pub use zcrop_io::parse_size;

/// `bytes`, if a dataset of that size can be made (at least one shard), or an error.
pub fn checked_size(bytes: u64) -> Result<u64> {
    if bytes < (1 << 20) {
        bail!("--dataset-size must be at least 1M");
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("abc").is_err());
    }

    #[test]
    fn default_size_is_about_two_gigabytes() {
        let s = Spec::with_size(2 << 30, Codec::Zstd, Layout::Sharded);
        assert_eq!(s.shape, [96, 12, 1024, 1024]);
        assert!((2u64 << 30) <= s.bytes() && s.bytes() < (2u64 << 30) + (400 << 20));
        assert_eq!(s.dir_name(), "u16_96x12x1024x1024_v3sharded_zstd1_s42.zarr");
        let s = s.chunked([8, 12, 256, 256], [1, 1, 64, 64]);
        assert_eq!(
            s.dir_name(),
            "u16_96x12x1024x1024_v3sharded_zstd1_c8x12x256x256_i1x1x64x64_s42.zarr"
        );
    }

    /// Every layout and codec reads back through zarr-front as [`row`] made it, edge chunks
    /// included.
    #[test]
    fn datasets_read_back_as_generated() {
        let dir = tempfile::tempdir().unwrap();
        let shape = [4, 3, 70, 90];
        for (codec, layout) in [
            (Codec::Zstd, Layout::Sharded),
            (Codec::BloscLz4, Layout::Sharded),
            (Codec::Zstd, Layout::V2),
        ] {
            let spec = Spec::new(shape, codec, layout).chunked([2, 3, 64, 64], [1, 1, 32, 32]);
            let path = ensure(&spec, dir.path(), &|_, _| {}).unwrap();
            let a = zcrop_zarr::Array::open(&path).unwrap();
            assert_eq!(a.shape(), &shape);
            let got = a.read_region(&[0, 0, 0, 0], &shape).unwrap();
            let mut want = Vec::new();
            let mut line = vec![0u16; 90];
            for t in 0..4 {
                for c in 0..3 {
                    for y in 0..70 {
                        row(&spec, t, c, y, &mut line);
                        want.extend(line.iter().flat_map(|v| v.to_ne_bytes()));
                    }
                }
            }
            assert!(got == want, "{} does not read back", spec.dir_name());
            assert_eq!(spec.bytes(), want.len() as u64);
        }
    }
}
