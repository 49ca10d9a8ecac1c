//! Counting IO: what a read costs in physical reads, shard-index reads and decodes.

mod common;

use common::{assert_same, copy_store, expected, region};
use zcrop_io::{BackendChoice, CoalesceLimits, IoConfig, IoEngine};
use zcrop_zarr::{Array, OpenOptions, WholeReason};

/// Options without a decoded-chunk cache, so that every read decodes.
fn no_cache() -> OpenOptions {
    OpenOptions {
        chunk_cache_bytes: Some(0),
        ..OpenOptions::default()
    }
}

fn fresh(options: &OpenOptions) -> (Array, IoEngine) {
    // A private engine, so its counters see only this test's reads; no coalescing, so every
    // request is one physical read.
    let engine = IoEngine::new(IoConfig {
        backend: BackendChoice::Uring,
        coalesce: CoalesceLimits::ADJACENT_ONLY,
        ..IoConfig::default()
    })
    .unwrap();
    let f = zcrop_fixtures::get("v3_workload_4d_u2");
    let a = Array::open_with(
        f.store_path(),
        &OpenOptions {
            engine: Some(engine.clone()),
            ..options.clone()
        },
    )
    .unwrap();
    (a, engine)
}

#[test]
fn a_crop_inside_one_inner_chunk_costs_two_reads_cold_one_warm() {
    let (a, engine) = fresh(&no_cache());
    // Inner chunks are (1, 1, 16, 16): this crop lies inside inner chunk (0, 0, 1, 1).
    let (origin, shape) = ([0, 0, 17, 18], [1, 1, 4, 5]);
    let before = engine.metrics();
    let cold = a.read_region(&origin, &shape).unwrap();
    let m = engine.metrics() - before;
    assert_eq!(
        m.physical_reads, 2,
        "cold: shard index + inner chunk, {m:?}"
    );

    let before = engine.metrics();
    let warm = a.read_region(&origin, &shape).unwrap();
    let m = engine.metrics() - before;
    assert_eq!(m.physical_reads, 1, "warm: the inner chunk only, {m:?}");
    assert_eq!(cold, warm);

    let mut out = vec![0u8; 20 * 2];
    let stats = a.read_region_into(&origin, &shape, &mut out).unwrap();
    assert_eq!(
        (
            stats.chunks,
            stats.chunks_decoded,
            stats.index_reads,
            stats.index_cache_hits
        ),
        (1, 1, 0, 1)
    );
}

#[test]
fn a_batch_reads_and_decodes_each_shared_chunk_once() {
    // Five crops over the same area (heavily overlapping) plus a far one: a small batch, one
    // submission.
    let origins: Vec<u64> = [
        [0, 0, 10, 10],
        [0, 0, 10, 10],
        [1, 0, 12, 14],
        [0, 0, 15, 9],
        [1, 0, 10, 10],
        [4, 0, 50, 70],
    ]
    .iter()
    .flatten()
    .copied()
    .collect();
    let stats = check_each_chunk_read_once(&origins, &[2, 3, 20, 20], 1);
    assert_eq!(stats.index_reads, 0);
}

#[test]
fn a_large_batch_reads_each_chunk_once_in_few_submissions() {
    // 540 chunks: the read may locate and submit its first chunks alone (their reads go out
    // sooner), in a few submissions at most.
    let (crop, origins) = common::large_batch();
    let stats = check_each_chunk_read_once(&origins, &crop, 2);
    assert_eq!(stats.chunks, 540);
}

/// Reads crops of `crop` at `origins` of `v3_workload_4d_u2` twice (the first warms the
/// shard-index cache) and checks the second: each distinct chunk read and decoded once, in at
/// most `max_submissions` batches to the engine, and equal to the oracle.
fn check_each_chunk_read_once(
    origins: &[u64],
    crop: &[u64],
    max_submissions: u64,
) -> zcrop_zarr::ReadStats {
    let (a, engine) = fresh(&no_cache());
    let f = zcrop_fixtures::get("v3_workload_4d_u2");
    let (data, shape, es) = expected(&f);
    let crops = origins.len() / 4;
    let mut out = vec![0u8; crops * crop.iter().product::<u64>() as usize * es];
    a.read_batch_into(origins, crop, &mut out).unwrap();
    out.fill(0);
    let before = engine.metrics();
    let stats = a.read_batch_into(origins, crop, &mut out).unwrap();
    let m = engine.metrics() - before;
    let n = distinct_chunks(origins, crop);
    assert_eq!(stats.chunks, n);
    assert_eq!(stats.chunks_decoded + stats.chunks_missing, n, "{stats:?}");
    assert_eq!(
        m.requests, stats.chunks_decoded,
        "one read per chunk present: {m:?}"
    );
    assert!(m.batches >= 1 && m.batches <= max_submissions, "{m:?}");
    let want: Vec<u8> = origins
        .chunks_exact(4)
        .flat_map(|o| region(&data, &shape, es, o, crop))
        .collect();
    assert_same(&out, &want, es, &format!("{crops} crops"));
    stats
}

/// Distinct inner chunks of `v3_workload_4d_u2` (inner chunks 1x1x16x16, 3 channels) that
/// crops of `crop` at `origins` touch.
fn distinct_chunks(origins: &[u64], crop: &[u64]) -> u64 {
    let mut distinct = std::collections::BTreeSet::new();
    for o in origins.chunks_exact(4) {
        for t in o[0]..o[0] + crop[0] {
            for c in 0..3 {
                for y in o[2] / 16..=(o[2] + crop[2] - 1) / 16 {
                    for x in o[3] / 16..=(o[3] + crop[3] - 1) / 16 {
                        distinct.insert((t, c, y, x));
                    }
                }
            }
        }
    }
    distinct.len() as u64
}

#[test]
fn decoded_chunk_cache_serves_repeated_reads() {
    let (a, engine) = fresh(&OpenOptions {
        chunk_cache_bytes: Some(8 << 20),
        ..OpenOptions::default()
    });
    let (origin, shape) = ([1u64, 0, 5, 5], [3u64, 3, 40, 40]);
    let first = a.read_region(&origin, &shape).unwrap();
    let before = engine.metrics();
    let mut second = vec![0u8; first.len()];
    let stats = a.read_region_into(&origin, &shape, &mut second).unwrap();
    let m = engine.metrics() - before;
    assert_eq!(first, second);
    assert_eq!(
        stats.chunks_cached,
        stats.chunks - stats.chunks_missing,
        "{stats:?}"
    );
    assert_eq!(stats.chunks_decoded, 0);
    assert_eq!(m.physical_reads, 0, "{m:?}");
    // Without a cache the same read decodes again.
    let (plain, _) = fresh(&no_cache());
    plain.read_region(&origin, &shape).unwrap();
    let mut again = vec![0u8; first.len()];
    let stats = plain.read_region_into(&origin, &shape, &mut again).unwrap();
    assert_eq!(stats.chunks_cached, 0);
    assert!(stats.chunks_decoded > 0);
    assert_eq!(again, first);
}

#[test]
fn a_full_chunk_cache_keeps_chunks_read_again_not_those_read_once() {
    // Room for 16 inner chunks of (1, 1, 16, 16) u16.
    let (a, _) = fresh(&OpenOptions {
        chunk_cache_bytes: Some(16 * 512),
        ..OpenOptions::default()
    });
    // 60 chunks read whole fill it.
    a.read_region(&[0, 0, 0, 0], &[2, 1, 70, 90]).unwrap();
    // Part of each of 4 other chunks.
    let (origin, shape) = ([5u64, 2, 4, 4], [1u64, 1, 24, 24]);
    let expected = a.read_region(&origin, &shape).unwrap();
    let read = || {
        let mut out = vec![0u8; expected.len()];
        let stats = a.read_region_into(&origin, &shape, &mut out).unwrap();
        assert_eq!(out, expected);
        stats
    };
    // The first read above decoded them in part and kept none; this second read is the first
    // seen again: each is decoded whole and kept.
    let second = read();
    assert_eq!(
        (second.chunks_cached, second.chunks_decoded),
        (0, 4),
        "{second:?}"
    );
    assert_eq!(
        second.whole_chunks.get(WholeReason::ChunkCache),
        4,
        "{second:?}"
    );
    let third = read();
    assert_eq!(
        (third.chunks_cached, third.chunks_decoded),
        (4, 0),
        "{third:?}"
    );
}

#[test]
fn a_chunk_cache_with_room_keeps_what_it_reads_first() {
    let (a, _) = fresh(&OpenOptions {
        chunk_cache_bytes: Some(16 * 512),
        ..OpenOptions::default()
    });
    let (origin, shape) = ([5u64, 2, 4, 4], [1u64, 1, 24, 24]);
    let first = a.read_region_into(&origin, &shape, &mut vec![0u8; 24 * 24 * 2]);
    assert_eq!(first.unwrap().whole_chunks.get(WholeReason::ChunkCache), 4);
    let mut out = vec![0u8; 24 * 24 * 2];
    let again = a.read_region_into(&origin, &shape, &mut out).unwrap();
    assert_eq!(
        (again.chunks_cached, again.chunks_decoded),
        (4, 0),
        "{again:?}"
    );
}

#[test]
fn aligned_whole_chunk_crops_decode_straight_into_the_output() {
    // Crops aligned to inner chunks: every chunk is a whole, contiguous part of its crop, so the
    // read decodes into the output (the result must still be right).
    let (a, _) = fresh(&no_cache());
    let f = zcrop_fixtures::get("v3_workload_4d_u2");
    let (data, shape, es) = expected(&f);
    let crop = [2u64, 1, 16, 16];
    let origins = [0u64, 1, 16, 32, 3, 2, 48, 64];
    let got = a.read_batch(&origins, &crop).unwrap();
    let want: Vec<u8> = origins
        .chunks_exact(4)
        .flat_map(|o| region(&data, &shape, es, o, &crop))
        .collect();
    assert_same(&got, &want, es, "aligned crops");
}

#[test]
fn storage_summary_counts_what_is_stored() {
    for name in [
        "v3_sharded_end",
        "v3_workload_4d_u2",
        "v2_blosc_lz4_shuffle",
        "v3_sharded_partial_nocrc_u1",
    ] {
        let f = zcrop_fixtures::get(name);
        let a = Array::open(f.store_path()).unwrap();
        let s = a.storage_summary().unwrap();
        assert_eq!(s.storage_chunks, f.n_chunks, "{name}");
        assert_eq!(
            s.storage_chunks - s.storage_chunks_present,
            f.n_missing_chunks,
            "{name}"
        );
        assert!(s.stored_bytes > 0);
        match a.shard_shape() {
            Some(_) => {
                let per_shard: u64 = f
                    .chunks
                    .iter()
                    .zip(f.inner_chunks.as_ref().unwrap())
                    .map(|(s, i)| s / i)
                    .product();
                assert_eq!(s.inner_chunks, Some(per_shard * f.n_chunks), "{name}");
                assert!(s.inner_chunks_present.unwrap() > 0, "{name}");
            }
            None => assert_eq!(s.inner_chunks, None),
        }
    }
}

#[test]
fn encoded_chunks_decode_to_the_array() {
    let f = zcrop_fixtures::get("v3_workload_4d_u2");
    let (data, shape, es) = expected(&f);
    let a = Array::open(f.store_path()).unwrap();
    let coords = vec![vec![0, 0, 0, 0], vec![5, 2, 4, 5], vec![2, 1, 3, 0]];
    let raw = a.read_encoded_chunks(&coords).unwrap();
    // One reused buffer, whatever it held before.
    let mut reused = vec![0xEEu8; 16 * 16 * es];
    for (c, bytes) in coords.iter().zip(raw) {
        let bytes = bytes.unwrap();
        let chunk = a.decode_chunk(&bytes).unwrap();
        a.decode_chunk_into(&bytes, &mut reused).unwrap();
        assert_eq!(reused, chunk, "chunk {c:?} into a reused buffer");
        // A buffer of the wrong size is an error, not a partial decode.
        let mut short = vec![0u8; reused.len() - 1];
        assert!(matches!(
            a.decode_chunk_into(&bytes, &mut short),
            Err(zcrop_zarr::ZarrError::Codec { .. })
        ));
        // Compare the part of the chunk inside the array.
        let origin: Vec<u64> = c.iter().map(|x| x * 16).collect();
        let origin = [c[0], c[1], origin[2], origin[3]];
        let h = (shape[2] - origin[2]).min(16);
        let w = (shape[3] - origin[3]).min(16);
        let want = region(&data, &shape, es, &origin, &[1, 1, h, w]);
        let got: Vec<u8> = (0..h as usize)
            .flat_map(|r| chunk[r * 32..r * 32 + w as usize * 2].to_vec())
            .collect();
        assert_eq!(got, want, "chunk {c:?}");
    }
    assert!(a.read_encoded_chunks(&[vec![6, 0, 0, 0]]).is_err());
}

/// A shard replaced between reads (written to a temporary file and renamed over, as
/// zarr-python writes) is a new file: its cached index and decoded chunks are not used again,
/// they are read again; an unchanged file keeps being served from the caches.
#[test]
fn a_shard_replaced_between_reads_is_read_again() {
    let (_d, store) = copy_store("v3_workload_4d_u2");
    let engine = IoEngine::new(IoConfig {
        coalesce: CoalesceLimits::ADJACENT_ONLY,
        ..IoConfig::default()
    })
    .unwrap();
    for chunk_cache_bytes in [Some(0), Some(8 << 20), None] {
        let a = Array::open_with(
            &store,
            &OpenOptions {
                engine: Some(engine.clone()),
                chunk_cache_bytes,
                ..OpenOptions::default()
            },
        )
        .unwrap();
        // Inside inner chunk (0, 0, 1, 1) of shard c/0/0/0/0.
        let (origin, shape) = ([0, 0, 17, 18], [1, 1, 4, 5]);
        let first = a.read_region(&origin, &shape).unwrap();
        let mut out = vec![0u8; first.len()];
        let read = |out: &mut Vec<u8>| a.read_region_into(&origin, &shape, out).unwrap();
        let cached =
            |s: &zcrop_zarr::ReadStats| (s.chunks_cached, s.index_cache_hits, s.index_reads);
        let warm = if chunk_cache_bytes == Some(0) {
            (0, 1, 0)
        } else {
            (1, 0, 0)
        };
        assert_eq!(cached(&read(&mut out)), warm, "cache {chunk_cache_bytes:?}");
        let shard = store.join("c/0/0/0/0");
        let tmp = store.join("c/0/0/0/0.tmp");
        std::fs::copy(&shard, &tmp).unwrap();
        std::fs::rename(&tmp, &shard).unwrap();
        let s = read(&mut out);
        assert_eq!(cached(&s), (0, 0, 1), "cache {chunk_cache_bytes:?}: {s:?}");
        assert_eq!(s.chunks_decoded, 1);
        assert_eq!(out, first);
        assert_eq!(cached(&read(&mut out)), warm, "cache {chunk_cache_bytes:?}");
    }
}

#[test]
fn stats_count_each_chunk_to_the_last_byte_its_crops_need() {
    let (a, _) = fresh(&no_cache());
    // Inner chunks are (1, 1, 16, 16) of u16. A 2 x 2 crop at rows and columns 15 touches
    // four of them; of each it needs up to element 255 (the last), 240, 15 and 0 in C order.
    // A second crop at (0, 0) needs the first chunk only up to element 17: counted once, to
    // its end.
    let origins = [0, 0, 15, 15, 0, 0, 0, 0];
    let mut out = vec![0u8; 2 * 4 * 2];
    let stats = a
        .read_batch_into(&origins, &[1, 1, 2, 2], &mut out)
        .unwrap();
    assert_eq!(stats.chunks, 4);
    assert_eq!(stats.bytes_to_last_needed, (256 + 241 + 16 + 1) * 2);
}
