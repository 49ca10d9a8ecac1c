//! The process-wide decoded-chunk cache arrays share by default. One test, alone in its
//! process, so that the cache's bytes are this test's alone.

use zcrop_zarr::{
    Array, DEFAULT_CHUNK_CACHE_BYTES, OpenOptions, shared_chunk_cache_budget,
    shared_chunk_cache_usage,
};

fn held() -> usize {
    shared_chunk_cache_usage()
        .expect("the shared cache is on")
        .0
}

#[test]
fn arrays_share_one_cache_by_default_and_keep_apart_in_it() {
    let fixture = zcrop_fixtures::get("v3_workload_4d_u2");
    let budget = shared_chunk_cache_budget().unwrap();
    if std::env::var_os("ZCROP_CHUNK_CACHE").is_none() {
        assert_eq!(budget, DEFAULT_CHUNK_CACHE_BYTES);
    }
    let open = |chunk_cache_bytes| {
        let options = OpenOptions {
            chunk_cache_bytes,
            ..OpenOptions::default()
        };
        Array::open_with(fixture.store_path(), &options).unwrap()
    };
    let a = open(None);
    assert_eq!(a.chunk_cache(), Some((budget, true)));
    assert_eq!(held(), 0);
    // Rows 5..45, columns 5..45 of two steps and three channels: 3 x 3 inner chunks of
    // (1, 1, 16, 16) u16 (512 bytes) in each of the 6 planes.
    let (origin, shape) = ([1u64, 0, 5, 5], [2u64, 3, 40, 40]);
    let mut out = vec![0u8; 2 * 3 * 40 * 40 * 2];
    let first = a.read_region_into(&origin, &shape, &mut out).unwrap();
    assert_eq!((first.chunks, first.chunks_cached), (54, 0), "{first:?}");
    assert_eq!(held(), 54 * 512);
    let again = a.read_region_into(&origin, &shape, &mut out).unwrap();
    assert_eq!(again.chunks_cached, 54, "{again:?}");

    // Another open of the same array (which may see a rewritten store) has entries of its
    // own, in the same budget.
    let b = open(None);
    let mut other = vec![0u8; out.len()];
    let stats = b.read_region_into(&origin, &shape, &mut other).unwrap();
    assert_eq!(stats.chunks_cached, 0, "{stats:?}");
    assert_eq!(other, out);
    assert_eq!(held(), 2 * 54 * 512);
    // A clone shares its array's entries.
    let clone = b.clone();
    assert_eq!(
        clone
            .read_region_into(&origin, &shape, &mut other)
            .unwrap()
            .chunks_cached,
        54
    );

    // Clearing one array's caches, or dropping it, leaves the other's entries.
    b.clear_caches();
    assert_eq!(held(), 54 * 512);
    assert_eq!(
        a.read_region_into(&origin, &shape, &mut out)
            .unwrap()
            .chunks_cached,
        54
    );
    clone.read_region_into(&origin, &shape, &mut other).unwrap();
    assert_eq!(held(), 2 * 54 * 512);
    drop((b, clone));
    assert_eq!(
        held(),
        54 * 512,
        "the last handle of an array took its entries"
    );
    drop(a);
    assert_eq!(held(), 0);

    // An array of its own cache, or of none, leaves the shared one alone.
    let own = open(Some(1 << 20));
    assert_eq!(own.chunk_cache(), Some((1 << 20, false)));
    own.read_region_into(&origin, &shape, &mut out).unwrap();
    assert_eq!(
        own.read_region_into(&origin, &shape, &mut out)
            .unwrap()
            .chunks_cached,
        54
    );
    let none = open(Some(0));
    assert_eq!(none.chunk_cache(), None);
    assert_eq!(
        none.read_region_into(&origin, &shape, &mut out)
            .unwrap()
            .chunks_cached,
        0
    );
    assert_eq!(held(), 0);
    // Chunks of local files that decode at about the speed of a copy (LZ4 inside blosc) stay
    // out of the shared cache; a cache of the array's own takes them.
    let lz4 = zcrop_fixtures::get("v2_blosc_lz4_shuffle");
    let open_lz4 = |chunk_cache_bytes| {
        let options = OpenOptions {
            chunk_cache_bytes,
            ..OpenOptions::default()
        };
        Array::open_with(lz4.store_path(), &options).unwrap()
    };
    let region = |a: &Array| {
        let shape: Vec<u64> = a.shape().iter().map(|&n| n.min(8)).collect();
        let mut out = vec![0u8; a.read_region(&vec![0; shape.len()], &shape).unwrap().len()];
        let stats = a
            .read_region_into(&vec![0; shape.len()], &shape, &mut out)
            .unwrap();
        (out, stats)
    };
    let shared_lz4 = open_lz4(None);
    let (first, _) = region(&shared_lz4);
    let (again, stats) = region(&shared_lz4);
    assert_eq!(first, again);
    assert_eq!(stats.chunks_cached, 0, "{stats:?}");
    assert_eq!(held(), 0);
    let own_lz4 = open_lz4(Some(1 << 20));
    region(&own_lz4);
    let (own, stats) = region(&own_lz4);
    assert_eq!(own, first);
    assert!(stats.chunks_cached > 0, "{stats:?}");

    // They go in once the reads show the cache would serve them: an array read again and
    // again (two chunks of 75600 bytes) is judged after 512 reads of its chunks.
    drop((shared_lz4, own_lz4));
    let blocks =
        Array::open(zcrop_fixtures::get("v2_blosc_lz4_shuffle_blocks_u2").store_path()).unwrap();
    let shape = blocks.shape().to_vec();
    let all = blocks.read_region(&vec![0; shape.len()], &shape).unwrap();
    let mut kept_at = None;
    for i in 1..400 {
        let mut out = vec![0u8; all.len()];
        let stats = blocks
            .read_region_into(&vec![0; shape.len()], &shape, &mut out)
            .unwrap();
        assert_eq!(out, all);
        if stats.chunks_cached > 0 {
            kept_at = Some(i);
            break;
        }
    }
    let kept_at = kept_at.expect("chunks read again and again are kept");
    assert!((250..=300).contains(&kept_at), "kept after {kept_at} reads");
    assert_eq!(held(), 2 * 75600);
    drop(blocks);
    assert_eq!(held(), 0);

    // A cache that would hold fewer than four chunks is not used.
    assert_eq!(open(Some(4 * 512)).chunk_cache(), Some((4 * 512, false)));
    assert_eq!(open(Some(4 * 512 - 1)).chunk_cache(), None);
}
