//! The fuzz targets of zarr-front's parsers and decoders, as plain functions over its public
//! API: each takes arbitrary bytes and must return (an error inside is fine) without
//! panicking, aborting or reading out of bounds.
//!
//! Two drivers include this file: the cargo-fuzz binaries in `zarr-front/fuzz`
//! (coverage-guided, for long runs that grow the corpus) and, on the stable toolchain, the
//! runner in `tests/fuzz.rs`, which replays the corpus committed in `zarr-front/fuzz/corpus`
//! and then mutates it for a fixed time (`ZCROP_FUZZ_SECONDS` per target, 1 by default; CI
//! runs longer).

use zcrop_zarr::{Array, DimSelection, OpenOptions};

/// Arbitrary bytes as array metadata (`zarr.json` or `.zarray`, by the first byte's low bit):
/// opening returns an error or an array; an opened array answers its accessors and sizes a
/// small read.
pub(crate) fn metadata(data: &[u8]) {
    let Some((&format, json)) = data.split_first() else {
        return;
    };
    let format = if format & 1 == 0 { 2 } else { 3 };
    let dir = std::env::temp_dir().join("zcrop-fuzz-empty");
    if let Ok(a) = Array::from_metadata_json(json, format, &dir, &OpenOptions::default()) {
        let _ = (
            a.shape(),
            a.numpy_dtype(),
            a.chunk_shape(),
            a.shard_index_size(),
        );
        let nd = a.ndim();
        if nd > 0 && a.shape().iter().all(|&s| s > 0) && a.element_size() * nd <= 64 {
            let origin = vec![0u64; nd];
            let one: Vec<DimSelection> = (0..nd)
                .map(|_| DimSelection::Range { start: 0, len: 1 })
                .collect();
            let _ = a.output_len(&[one], 4);
            let _ = a.storage_key(&origin);
        }
    }
}

/// Arbitrary bytes as the shard index of one of `arrays` (the first byte picks it; its high
/// bit keeps the bytes' own length, else they are repeated to the index's size, so decoding
/// goes deep): entries or an error, every entry's end representable.
pub(crate) fn shard_index(arrays: &[Array], data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let sharded: Vec<&Array> = arrays
        .iter()
        .filter(|a| a.shard_index_size().is_some())
        .collect();
    if sharded.is_empty() {
        return;
    }
    let a = sharded[pick as usize % sharded.len()];
    let size = a.shard_index_size().unwrap_or(0) as usize;
    let bytes: Vec<u8> = if pick & 0x80 == 0 {
        rest.iter().copied().cycle().take(size).collect()
    } else {
        rest.to_vec()
    };
    if let Ok(entries) = a.decode_shard_index(&bytes, Some(u64::from(pick) * 1000)) {
        assert!(
            entries
                .iter()
                .flatten()
                .all(|(o, n)| o.checked_add(*n).is_some())
        );
    }
}

/// Arbitrary bytes as a chunk of one of `arrays` (the first byte picks it): the decoded chunk,
/// of exactly the chunk's size, or an error.
pub(crate) fn chunk(arrays: &[Array], data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    if arrays.is_empty() {
        return;
    }
    let a = &arrays[pick as usize % arrays.len()];
    if let Ok(chunk) = a.decode_chunk(rest) {
        let n: u64 = a.chunk_shape().iter().product();
        assert_eq!(chunk.len() as u64, n * a.element_size() as u64);
    }
}

/// Arbitrary bytes as a chunk of one of `arrays`, decoded only over a range (the partial zstd
/// block decoder, blosc's block decode, stopping early): the range's bytes or an error. Head:
/// array (1 byte), start and length (u16 LE each).
pub(crate) fn chunk_range(arrays: &[Array], data: &[u8]) {
    let Some((head, rest)) = data.split_first_chunk::<5>() else {
        return;
    };
    if arrays.is_empty() {
        return;
    }
    let a = &arrays[head[0] as usize % arrays.len()];
    let n = (a.chunk_shape().iter().product::<u64>() as usize * a.element_size()).max(1);
    let start = u16::from_le_bytes([head[1], head[2]]) as usize % n;
    let end = (start + u16::from_le_bytes([head[3], head[4]]) as usize).min(n);
    if let Ok(bytes) = a.decode_chunk_range(rest, start..end) {
        assert_eq!(bytes.len(), end - start);
    }
}

/// Arbitrary bytes as a one-block zstd frame, decoded over a range by zcrop's partial decoder:
/// never a panic or a write outside the chunk; wherever libzstd decodes the frame to the chunk's
/// size, the range holds libzstd's bytes. Head: mode, start and length (u16 LE each), chunk
/// size (u16 LE, doubled for modes with bit 1 set; 0 takes the size the frame declares); an
/// odd mode compresses the rest first (at
/// level 1, 3, 9 or 19 by its bits 2-3), so valid frames of any content are decoded too, and
/// those are never called corrupt.
pub(crate) fn zstd_range(data: &[u8]) {
    let Some((head, rest)) = data.split_first_chunk::<7>() else {
        return;
    };
    let mode = head[0];
    let u16_at = |i: usize| usize::from(u16::from_le_bytes([head[i], head[i + 1]]));
    let (frame, size) = if mode & 1 == 1 {
        let level = [1, 3, 9, 19][usize::from(mode >> 2) % 4];
        let Ok(frame) = zstd::bulk::compress(rest, level) else {
            return;
        };
        (frame, rest.len())
    } else {
        // A size of 0: the one the frame header declares, if any (at most 128 KiB).
        let declared = || {
            let n = zstd::zstd_safe::get_frame_content_size(rest).ok()??;
            usize::try_from(n).ok().filter(|&n| n <= 1 << 17)
        };
        let size = match u16_at(5) << ((mode >> 1) & 1) {
            0 => declared().unwrap_or(0),
            n => n,
        };
        (rest.to_vec(), size)
    };
    let start = u16_at(1) % (size + 1);
    let end = (start + u16_at(3)).min(size);
    let mut ours = vec![0xA5u8; size];
    let mut scratch = Vec::new();
    let result =
        zcrop_codec::zstd::decode_range(&frame, &mut ours, start..end, &mut scratch, f64::INFINITY);
    match result {
        Ok(got) => {
            assert!(got.start <= start && got.end >= end && got.end <= size);
            if let Ok(plain) = zstd::bulk::decompress(&frame, size)
                && plain.len() == size
            {
                assert_eq!(ours[start..end], plain[start..end]);
            }
        }
        Err(zcrop_codec::zstd::Error::Corrupt(e)) => {
            assert!(mode & 1 == 0, "a frame zstd wrote was called corrupt: {e}");
        }
        Err(zcrop_codec::zstd::Error::Unsupported(_)) => {}
    }
}

/// Arbitrary bytes as an LZ4 block (head: output size and target, u16 LE each), decoded whole
/// and up to the target by zcrop's decoder and by liblz4: zcrop's never panics or writes
/// outside its buffer, and wherever liblz4 decodes the block whole, zcrop's gives the same
/// bytes (liblz4 also lets through an offset of 0, which zcrop refuses, so a block liblz4
/// decodes may still be an error here); a prefix is what the whole block starts with.
pub(crate) fn lz4(data: &[u8]) {
    let Some((head, block)) = data.split_first_chunk::<4>() else {
        return;
    };
    let cap = usize::from(u16::from_le_bytes([head[0], head[1]])) % 20_000;
    let want = usize::from(u16::from_le_bytes([head[2], head[3]])) % (cap + 1);
    let mut ours = vec![0u8; cap];
    let mut theirs = vec![0u8; cap];
    let whole = zcrop_codec::lz4::decompress(block, &mut ours, cap);
    if let Some(n) = whole {
        assert!(n <= cap);
    }
    if let (Some(n), Some(m)) = (
        whole,
        zcrop_codec::ffi::lz4_decompress(block, &mut theirs, cap),
    ) {
        assert_eq!(n, m);
        assert_eq!(ours[..n], theirs[..n]);
    }
    let mut part = vec![0u8; cap];
    if let Some(n) = zcrop_codec::lz4::decompress(block, &mut part, want) {
        assert!(n <= cap);
        if let Some(w) = whole
            && n >= want
        {
            assert!(w >= want);
            assert_eq!(part[..want], ours[..want]);
        }
    }
}

/// Arbitrary bytes as a chunk of variable-length strings (head: element count 1..=64 and
/// whether a zstd codec follows vlen-utf8): elements, as many as the chunk has, or an error.
pub(crate) fn vlen(data: &[u8]) {
    let Some((&head, chunk)) = data.split_first() else {
        return;
    };
    let n = u64::from(head & 0x3f) + 1;
    let zstd = if head & 0x40 == 0 {
        ""
    } else {
        r#",{"name":"zstd","configuration":{"level":0,"checksum":false}}"#
    };
    let meta = format!(
        r#"{{"zarr_format":3,"node_type":"array","shape":[{n}],"data_type":"string",
            "chunk_grid":{{"name":"regular","configuration":{{"chunk_shape":[{n}]}}}},
            "chunk_key_encoding":{{"name":"default"}},"fill_value":"",
            "codecs":[{{"name":"vlen-utf8"}}{zstd}]}}"#
    );
    let dir = std::env::temp_dir().join("zcrop-fuzz-empty");
    let a = Array::from_metadata_json(meta.as_bytes(), 3, &dir, &OpenOptions::default())
        .expect("a valid string array");
    if let Ok(elements) = a.decode_variable_chunk(chunk) {
        assert_eq!(elements.len() as u64, n);
    }
}

/// A copy of the spec-v1 Icechunk fixture repository, with its original files kept to restore.
struct IcechunkRepo {
    root: std::path::PathBuf,
    originals: Vec<(std::path::PathBuf, Vec<u8>)>,
}

/// The copy this process fuzzes, made on first use.
fn icechunk_repo() -> &'static IcechunkRepo {
    static REPO: std::sync::OnceLock<IcechunkRepo> = std::sync::OnceLock::new();
    REPO.get_or_init(|| {
        let src =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/icechunk-repos/v1");
        // One fixed place, rewritten by each run (as `metadata`'s empty directory is).
        let root = std::env::temp_dir().join("zcrop-fuzz-icechunk");
        let mut originals = Vec::new();
        let mut stack = vec![src.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    let dest = root.join(p.strip_prefix(&src).unwrap());
                    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
                    let bytes = std::fs::read(&p).unwrap();
                    std::fs::write(&dest, &bytes).unwrap();
                    originals.push((dest, bytes));
                }
            }
        }
        IcechunkRepo { root, originals }
    })
}

/// Arbitrary bytes as a file of an Icechunk repository (the first byte picks which: 0 the
/// tip's snapshot, 1 every manifest, each given as its decompressed body and written behind
/// the original header, zstd-compressed; 2 the branch's `ref.json`; 3 a serialized Python
/// session): opening the tip and reading every array returns values or errors.
pub(crate) fn icechunk(data: &[u8]) {
    use zcrop_zarr::icechunk::{IcechunkSnapshot, Version, session_repository};
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    if which % 4 == 3 {
        let _ = session_repository(body);
        return;
    }
    let repo = icechunk_repo();
    for (path, bytes) in &repo.originals {
        std::fs::write(path, bytes).unwrap();
    }
    let tip_ref = repo.root.join("refs/branch.main/ref.json");
    let tip = std::fs::read_to_string(&tip_ref).unwrap();
    let tip_id = tip.split('"').nth(3).unwrap_or_default().to_string();
    let with_header = |original: &[u8]| {
        let mut out = original[..39.min(original.len())].to_vec();
        out.extend(zstd::bulk::compress(body, 1).unwrap_or_default());
        out
    };
    for (path, bytes) in &repo.originals {
        let rel = path.strip_prefix(&repo.root).unwrap();
        let file = rel.to_string_lossy();
        let replace = match which % 4 {
            0 => file == format!("snapshots/{tip_id}"),
            1 => file.starts_with("manifests/"),
            _ => rel == std::path::Path::new("refs/branch.main/ref.json"),
        };
        if replace {
            let new = if which % 4 == 2 {
                body.to_vec()
            } else {
                with_header(bytes)
            };
            std::fs::write(path, new).unwrap();
        }
    }
    let Ok(snap) = IcechunkSnapshot::open(
        &repo.root,
        &Version::Branch("main".into()),
        &OpenOptions::default(),
        Vec::new(),
    ) else {
        return;
    };
    for (path, is_array) in snap.nodes() {
        if let (true, Ok(a)) = (is_array, snap.array(&path)) {
            let shape = a.shape().to_vec();
            if shape.iter().product::<u64>() <= 1 << 16 {
                let _ = a.read_region(&vec![0; shape.len()], &shape);
            }
        } else if let Ok(g) = snap.group(&path) {
            let _ = g.members();
        }
    }
}

/// Fetching a blosc chunk by block (`BlockIndex`). Head: mode (1 byte), the wanted range's
/// start and length (u16 LE each), the item size (1 byte). Mode even: the rest is an
/// arbitrary chunk, whose header and offsets are parsed from its prefix, and a chunk rebuilt
/// from the blocks holding the range (`extent`) decodes (ours and c-blosc's `getitem`) to
/// bytes or an error, never a panic or a read outside it. Mode odd: the rest is data,
/// compressed by c-blosc (codec, shuffle, item size and block size from the head), and the
/// rebuilt chunk must decode the range to the data's bytes.
pub(crate) fn blosc_blocks(data: &[u8]) {
    use zcrop_codec::blosc::{BlockIndex, Scratch, decoded_size, open};
    use zcrop_codec::ffi;
    let Some((head, rest)) = data.split_first_chunk::<6>() else {
        return;
    };
    let start = usize::from(u16::from_le_bytes([head[1], head[2]]));
    let len = usize::from(u16::from_le_bytes([head[3], head[4]]));
    let elsize = usize::from(head[5] % 8) + 1;
    let (chunk, plain) = if head[0] % 2 == 0 {
        (rest.to_vec(), None)
    } else {
        if rest.is_empty() {
            return;
        }
        let cname = ["lz4", "zstd", "blosclz", "lz4hc"][usize::from(head[0] / 2) % 4];
        let shuffle = i32::from(head[0] / 8) % 3;
        let blocksize = [0, 1 << 10, 4 << 10, 16 << 10][usize::from(head[0] / 32) % 4];
        let chunk = ffi::compress::blosc_compress(rest, elsize, shuffle, cname, blocksize);
        (chunk, Some(rest))
    };
    let Some(nbytes) = decoded_size(&chunk).filter(|&n| n > 0 && n <= 1 << 22) else {
        return;
    };
    let prefix = &chunk[..BlockIndex::prefix_len(nbytes).min(chunk.len())];
    let Some(index) = BlockIndex::parse(prefix, nbytes) else {
        return;
    };
    let start = start % nbytes;
    let want = start..(start + len.max(1)).min(nbytes);
    // The blocks that hold `want` (what a guessed fetch assembles), whether or not fetching
    // them would save half of the chunk.
    let Some(span) = index.extent(&want, elsize) else {
        return;
    };
    assert!(index.span(&want, elsize).is_none_or(|s| s == span));
    let Some(fetched) = chunk.get(span.clone()) else {
        return;
    };
    let Ok(rebuilt) = index.assemble(&span, fetched) else {
        return;
    };
    let mut ours = None;
    if let Ok(c) = open(&rebuilt, want.clone(), &mut Scratch::default()) {
        let mut out = vec![0u8; want.len()];
        c.gather(want.start, &mut out);
        ours = Some(out);
    }
    let mut theirs = None;
    if let Ok(h) = ffi::blosc_header(&rebuilt) {
        let ts = h.typesize;
        let (a, b) = (
            want.start / ts * ts,
            (want.end.div_ceil(ts) * ts).min(h.nbytes),
        );
        let mut out = vec![0u8; b - a];
        if b > a
            && b - a + h.blocksize <= h.nbytes
            && ffi::blosc_getitem(&rebuilt, &h, a, &mut out).is_ok()
        {
            theirs = Some(out[want.start - a..want.end - a].to_vec());
        }
    }
    if let Some(plain) = plain {
        let expected = &plain[want.clone()];
        assert!(
            ours.is_some() || theirs.is_some(),
            "a valid chunk's blocks did not decode"
        );
        for got in [&ours, &theirs].into_iter().flatten() {
            assert_eq!(got.as_slice(), expected, "blocks {span:?} of a valid chunk");
        }
    }
}
