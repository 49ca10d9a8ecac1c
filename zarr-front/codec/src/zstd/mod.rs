//! Partial decoding of single-block zstd frames: only the part of a chunk that crops need.
//!
//! libzstd decodes a block (up to 128 KiB) whole, so a chunk of one block cannot stop early
//! through it. Yet a random crop usually needs only a band of rows of each chunk it touches,
//! and the chunks of imagery compressed at low levels are almost all Huffman-coded literals:
//! four independent streams, each producing a quarter of the literals. This module decodes
//! such a block itself (RFC 8878) and decodes only the literal streams that hold the needed
//! band, stopping inside the last one, then runs only the sequences that reach the band.
//! Sequences are decoded only up to the band's end, so a band early in a block of thousands of
//! sequences (imagery at level 3 and up) pays; a band late in one depends, through chains of
//! short matches, on nearly all of the block before it and goes to libzstd
//! ([`MAX_SHARE`]).
//!
//! Scope: frames of exactly one block, without a dictionary, where decoding the needed part
//! here costs less than libzstd decoding the block ([`MAX_SHARE`]); anything else is
//! [`Error::Unsupported`] and the caller decodes with libzstd. Bytes outside the returned range
//! are left as they were. What lies outside the needed part is not verified (the streams and
//! sequences not decoded, the bits after the stop), as with any decoder that stops early; a
//! frame checksum, when one is to be verified, needs a full decode and the caller does not
//! come here.

use std::ops::Range;

/// Decoding here pays when what it decodes (the needed literal streams, and the sequences up
/// to the band's end, each weighted by its cost) costs at most this share of libzstd's whole
/// block (all literals and sequences, weighted by libzstd's costs), counted in literals decoded
/// here: per literal this decoder costs about twice libzstd's four-stream assembly loop, and
/// building its Huffman table adds a little per chunk. `f64::INFINITY` decodes here whatever
/// is in scope.
pub const MAX_SHARE: f64 = 0.6;

/// What decoding and running one sequence costs here, in literals decoded here (fitted to
/// imagery blocks of few and of many sequences; docs/performance.md).
const SEQUENCE_COST: f64 = 18.0;
/// What one sequence costs libzstd, in literals it decodes (fitted the same way).
const LIB_SEQUENCE_COST: f64 = 9.0;

/// Whether decoding `literals` literals (whole streams from their starts) and the first
/// `sequences` sequences here costs at most `max_share` of libzstd decoding the whole block of
/// `nlit` literals and `count` sequences.
fn pays(literals: usize, sequences: usize, nlit: usize, count: usize, max_share: f64) -> bool {
    let here = literals as f64 + SEQUENCE_COST * sequences as f64;
    here <= max_share * (nlit as f64 + LIB_SEQUENCE_COST * count as f64)
}

/// [`Error::Unsupported`] of a frame of more than one block.
pub const SEVERAL_BLOCKS: &str = "frame of several blocks";
/// [`Error::Unsupported`] of a block where decoding the sequences a range needs would cost more
/// than libzstd decoding the block (an estimate, made before decoding them).
pub const TOO_MANY_SEQUENCES: &str = "too many sequences";
/// [`Error::Unsupported`] of a block whose needed literal streams hold more than the share of
/// its literals [`decode_many`] was given.
pub const MOST_OF_BLOCK_NEEDED: &str = "most of the block is needed";

const MAGIC: u32 = 0xFD2F_B528;
const MAX_BLOCK: usize = 128 * 1024;
const HUF_MAX_LOG: u32 = 11;

/// Why a frame was not decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A valid frame outside this decoder's scope (several blocks, a dictionary, ...).
    Unsupported(&'static str),
    /// The frame is malformed.
    Corrupt(String),
}

type Result<T> = std::result::Result<T, Error>;

fn corrupt<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Corrupt(msg.into()))
}

mod bits;
mod frame;
mod fse;
mod huffman;
mod literals;
mod sequences;

use frame::read_frame;
use huffman::{Huffman, Stream, decode_streams};
use literals::{Literals, read_literals};
use sequences::{Sequence, read_sequences, sequence_count};

thread_local! {
    static DCTX: std::cell::RefCell<Option<zstd::zstd_safe::DCtx<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Calls `f` with this thread's libzstd decompression context (created on first use), for
/// the frames decoded whole.
pub fn with_dctx<R>(f: impl FnOnce(&mut zstd::zstd_safe::DCtx<'static>) -> R) -> R {
    DCTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        f(slot.get_or_insert_with(zstd::zstd_safe::DCtx::create))
    })
}

/// One chunk to decode: its frame, its decoded size (`out.len()`) and the part crops need.
pub struct Job<'a> {
    /// The encoded chunk: one zstd frame.
    pub src: &'a [u8],
    /// Where the chunk decodes to (the whole chunk's size).
    pub out: &'a mut [u8],
    /// The byte range of the chunk that must be decoded.
    pub want: Range<usize>,
    /// Reused room for the literals of blocks that also hold sequences.
    pub scratch: &'a mut Vec<u8>,
}

/// A frame parsed down to what decoding `want` takes.
struct Parsed<'a> {
    literals: Literals<'a>,
    /// The sequences decoding `want` takes (the block's first ones).
    sequences: Vec<Sequence>,
    /// Sequences in the block.
    count: usize,
    /// Lowest output position the wanted bytes depend on.
    lo: usize,
    /// Literals needed.
    lits: Range<usize>,
}

fn parse<'a>(
    src: &'a [u8],
    full: usize,
    want: &Range<usize>,
    max_share: f64,
) -> Result<Parsed<'a>> {
    let frame = read_frame(src)?;
    if let Some(n) = frame.content_size
        && n != full
    {
        return corrupt(format!("frame declares {n} bytes, expected {full}"));
    }
    let (literals, seqs) = match frame.kind {
        0 => (Literals::Raw(frame.block), None),
        1 => (Literals::Rle(frame.block[0], frame.size), None),
        _ => {
            let (literals, n) = read_literals(frame.block)?;
            let section = &frame.block[n..];
            let (count, _) = sequence_count(section)?;
            let nlit = literals.count();
            // Sequences spread over the block roughly as its bytes do: estimate how many
            // decoding up to `want.end` takes before decoding them.
            let share = |at: usize| (nlit as u64 * at as u64 / full.max(1) as u64) as usize;
            let lits = literals.cost(&(share(want.start)..share(want.end).max(1)));
            let seqs = (count as u64 * want.end as u64).div_ceil(full.max(1) as u64) as usize;
            if count > 0 && !pays(0, seqs, nlit, count, max_share) {
                return Err(Error::Unsupported(TOO_MANY_SEQUENCES));
            }
            if !pays(lits, seqs, nlit, count, max_share) {
                return Err(Error::Unsupported(MOST_OF_BLOCK_NEEDED));
            }
            let seqs = read_sequences(section, nlit, full, want.end)?;
            (literals, Some(seqs))
        }
    };
    let nlit = literals.count();
    let count = seqs.as_ref().map_or(0, |s| s.count);
    let (sequences, used, end, complete) = match seqs {
        None if nlit != full => {
            return corrupt(format!("block decodes to {nlit} bytes, expected {full}"));
        }
        None => (Vec::new(), 0, full, true),
        Some(seqs) if seqs.complete() => {
            let matched = seqs.produced - seqs.literals_used;
            if nlit + matched != full {
                return corrupt(format!(
                    "block decodes to {} bytes, expected {full}",
                    nlit + matched
                ));
            }
            (seqs.list, seqs.literals_used, full, true)
        }
        // Decoding stopped at the sequence that reached `want.end`: the walk back starts
        // there, and no literals after its own are needed.
        Some(seqs) => {
            let end = seqs.produced;
            (seqs.list, seqs.literals_used, end, false)
        }
    };
    if sequences.is_empty() {
        return Ok(Parsed {
            literals,
            sequences,
            count: 0,
            lo: want.start,
            lits: want.clone(),
        });
    }
    // Walk back from the end to find the lowest output position and the literals the wanted
    // bytes depend on (matches pull in their sources).
    let mut lo = want.start;
    let mut lits = Range {
        start: usize::MAX,
        end: 0,
    };
    let mut need_literals = |run: Range<usize>, first_literal: usize, lo: usize| {
        let (a, b) = (run.start.max(lo), run.end.min(want.end));
        if a < b {
            lits.start = lits.start.min(first_literal + (a - run.start));
            lits.end = lits.end.max(first_literal + (b - run.start));
        }
    };
    // Literals after the last sequence (only when every sequence was decoded).
    let trailing = if complete { nlit - used } else { 0 };
    let mut pos = end - trailing;
    let mut lp = used;
    need_literals(pos..end, lp, lo);
    for s in sequences.iter().rev() {
        let (ll, ml, off) = (s.literals as usize, s.match_len as usize, s.offset as usize);
        let mpos = pos - ml;
        if off > mpos {
            return corrupt(format!("match offset {off} reaches before the chunk"));
        }
        if pos > lo && mpos < want.end {
            // An overlapping match repeats the `off` bytes before it; otherwise it copies
            // the bytes `off` back.
            lo = lo.min(if off < ml {
                mpos - off
            } else {
                mpos.max(lo) - off
            });
        }
        pos = mpos - ll;
        lp -= ll;
        need_literals(pos..mpos, lp, lo);
    }
    if lits.start > lits.end {
        lits = 0..0;
    }
    Ok(Parsed {
        literals,
        sequences,
        count,
        lo,
        lits,
    })
}

/// Copies shorter than this go as one fixed-size copy (a few instructions, no `memmove` call)
/// where the bytes after them up to the copy's end are still to be written.
const SHORT: usize = 16;

/// Writes the [`SHORT`] bytes of `src` to `out[at..]` as one fixed-size copy.
#[inline]
fn copy_short(out: &mut [u8], at: usize, src: &[u8]) {
    let src: &[u8; SHORT] = src.try_into().expect("SHORT bytes");
    let dst: &mut [u8; SHORT] = (&mut out[at..at + SHORT]).try_into().expect("SHORT bytes");
    *dst = *src;
}

/// Runs `sequences` over `[lo, end)` of `out`, literals taken from `scratch` (which holds at
/// least [`SHORT`] bytes after the last literal).
fn execute(sequences: &[Sequence], lo: usize, out: &mut [u8], scratch: &[u8], end: usize) {
    let mut pos = 0usize;
    let mut lp = 0usize;
    for s in sequences {
        if pos >= end {
            return;
        }
        let ll = s.literals as usize;
        let (a, b) = (pos.max(lo), (pos + ll).min(end));
        if a < b {
            let from = lp + (a - pos);
            if b - a <= SHORT && a + SHORT <= end {
                // The bytes past `b` are overwritten by the sequences that follow.
                copy_short(out, a, &scratch[from..from + SHORT]);
            } else {
                out[a..b].copy_from_slice(&scratch[from..from + (b - a)]);
            }
        }
        pos += ll;
        lp += ll;
        let (ml, off) = (s.match_len as usize, s.offset as usize);
        let (a, b) = (pos.max(lo), (pos + ml).min(end));
        if a < b {
            if off >= SHORT && b - a <= SHORT && a + SHORT <= end {
                let (head, tail) = out.split_at_mut(a);
                copy_short(tail, 0, &head[a - off..a - off + SHORT]);
            } else if off >= b - a {
                out.copy_within(a - off..b - off, a);
            } else {
                for p in a..b {
                    out[p] = out[p - off];
                }
            }
        }
        pos += ml;
    }
    let (a, b) = (pos.max(lo), end);
    if a < b {
        out[a..b].copy_from_slice(&scratch[lp + (a - pos)..lp + (b - pos)]);
    }
}

/// Decodes at least `want` of each job's one-block zstd frame into its `out`, the literal
/// streams of all jobs in one lockstep. Returns per job the range of `out` written (which
/// contains `want`), or why the job was not decoded. A job whose needed streams hold more
/// than `max_share` of its block's literals is left undecoded ([`Error::Unsupported`]).
pub fn decode_many(jobs: &mut [Job<'_>], max_share: f64) -> Vec<Result<Range<usize>>> {
    let parsed: Vec<Result<Parsed<'_>>> = jobs
        .iter()
        .map(|j| {
            let full = j.out.len();
            if j.want.start > j.want.end || j.want.end > full {
                return corrupt(format!(
                    "range {:?} outside a chunk of {full} bytes",
                    j.want
                ));
            }
            let p = parse(j.src, full, &j.want, max_share)?;
            let nlit = p.literals.count();
            let lits = p.literals.cost(&p.lits);
            if (nlit > 0 || p.count > 0) && !pays(lits, p.sequences.len(), nlit, p.count, max_share)
            {
                return Err(Error::Unsupported(MOST_OF_BLOCK_NEEDED));
            }
            Ok(p)
        })
        .collect();
    // The Huffman tables of the blocks decoded here.
    let tables: Vec<Option<Result<Huffman>>> = parsed
        .iter()
        .map(|p| match p {
            Ok(Parsed {
                literals: Literals::Huffman { tree, .. },
                ..
            }) => Some(Huffman::read(tree)),
            _ => None,
        })
        .collect();
    // Queue every job's literal streams, then run them all together.
    let mut written: Vec<Result<Range<usize>>> = Vec::with_capacity(jobs.len());
    let mut owner: Vec<usize> = Vec::new();
    {
        let mut streams: Vec<Stream<'_>> = Vec::new();
        for (i, ((job, p), table)) in jobs.iter_mut().zip(&parsed).zip(&tables).enumerate() {
            let Ok(p) = p else {
                written.push(Ok(0..0));
                continue;
            };
            let table = match table {
                Some(Err(e)) => {
                    written.push(Err(e.clone()));
                    continue;
                }
                Some(Ok(t)) => Some(t),
                None => None,
            };
            let target: &mut [u8] = if p.sequences.is_empty() {
                &mut *job.out
            } else {
                let nlit = p.literals.count();
                if job.scratch.len() < nlit + SHORT {
                    job.scratch.resize(nlit + SHORT, 0);
                }
                &mut job.scratch[..nlit]
            };
            written.push(p.literals.plan(table, p.lits.clone(), target, &mut streams));
            owner.resize(streams.len(), i);
        }
        for (r, &i) in decode_streams(&mut streams).into_iter().zip(&owner) {
            if let Err(e) = r
                && written[i].is_ok()
            {
                written[i] = Err(e);
            }
        }
    }
    jobs.iter_mut()
        .zip(parsed)
        .zip(written)
        .map(|((job, p), w)| {
            let p = p?;
            let w = w?;
            if p.sequences.is_empty() {
                return Ok(w);
            }
            execute(&p.sequences, p.lo, job.out, job.scratch, job.want.end);
            Ok(p.lo..job.want.end)
        })
        .collect()
}

/// Decodes at least `want` of a one-block zstd frame whose decoded size is `out.len()`, into
/// `out` (see [`decode_many`]). Returns the range of `out` that was written.
///
/// # Panics
/// Never: [`decode_many`] returns one result per job.
pub fn decode_range(
    src: &[u8],
    out: &mut [u8],
    want: Range<usize>,
    scratch: &mut Vec<u8>,
    max_share: f64,
) -> Result<Range<usize>> {
    let mut jobs = [Job {
        src,
        out,
        want,
        scratch,
    }];
    decode_many(&mut jobs, max_share).pop().expect("one job")
}

#[cfg(test)]
mod tests {
    use super::fse::Fse;
    use super::sequences::LL_DEFAULT;
    use super::*;
    use rand::{RngExt, SeedableRng, rngs::StdRng};

    /// uint16 imagery like the benchmark's: a smooth field plus 5 bits of noise.
    fn imagery(n: usize, rng: &mut StdRng) -> Vec<u8> {
        let phase: f64 = rng.random_range(0.0..6.0);
        (0..n / 2)
            .flat_map(|i| {
                let (y, x) = ((i / 256) as f64, (i % 256) as f64);
                let base = 20000.0 + 8000.0 * ((y * 0.011 + phase).sin() * (x * 0.013).cos());
                let v = base as u16 + rng.random_range(0..32u16);
                v.to_le_bytes()
            })
            .collect()
    }

    /// Imagery with rows repeated from earlier ones and zero runs: a few long matches, some
    /// overlapping their source.
    fn imagery_with_repeats(n: usize, rng: &mut StdRng) -> Vec<u8> {
        let mut v = imagery(n, rng);
        for _ in 0..rng.random_range(1..6) {
            let len = rng.random_range(16..2048).min(n / 4);
            let dst = rng.random_range(len..n - len);
            if rng.random_range(0..2) == 0 {
                let src = rng.random_range(0..dst - len + 1);
                v.copy_within(src..src + len, dst);
            } else {
                v[dst..dst + len].fill(0);
            }
        }
        v
    }

    fn text(n: usize, rng: &mut StdRng) -> Vec<u8> {
        const WORDS: [&str; 8] = [
            "zarr ", "chunk ", "shard ", "crop ", "decode ", "io ", "a ", "the ",
        ];
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(WORDS[rng.random_range(0..WORDS.len())].as_bytes());
        }
        v.truncate(n);
        v
    }

    fn data(kind: usize, n: usize, rng: &mut StdRng) -> Vec<u8> {
        match kind {
            0 => imagery(n, rng),
            1 => imagery_with_repeats(n, rng),
            2 => (0..n).map(|_| rng.random::<u8>()).collect(),
            3 => vec![7u8; n],
            _ => text(n, rng),
        }
    }

    /// Every wanted range decodes to the bytes libzstd gives, or the frame is declared out of
    /// scope; returns how many decodes went through this decoder and how many bytes they wrote.
    fn check(plain: &[u8], frame: &[u8], rng: &mut StdRng, tries: usize) -> (usize, usize) {
        assert_eq!(zstd::bulk::decompress(frame, plain.len()).unwrap(), plain);
        let (mut done, mut written) = (0, 0);
        let mut scratch = Vec::new();
        for t in 0..tries {
            let n = plain.len();
            let want = match t {
                0 => 0..n,
                1 => 0..n.min(1),
                _ => {
                    let a = rng.random_range(0..n);
                    a..rng.random_range(a..=n)
                }
            };
            let mut out = vec![0xA5u8; n];
            match decode_range(frame, &mut out, want.clone(), &mut scratch, f64::INFINITY) {
                Ok(got) => {
                    assert!(
                        got.start <= want.start && got.end >= want.end,
                        "{got:?} {want:?}"
                    );
                    assert!(got.end <= n);
                    assert_eq!(
                        out[want.clone()],
                        plain[want.clone()],
                        "range {want:?} of {n}"
                    );
                    done += 1;
                    written += got.len();
                }
                Err(Error::Unsupported(_)) => {}
                Err(Error::Corrupt(e)) => panic!("valid frame called corrupt: {e} ({want:?})"),
            }
        }
        (done, written)
    }

    #[test]
    fn matches_libzstd_on_every_kind_of_block() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut by_kind = [0usize; 5];
        for round in 0..120 {
            let kind = round % 5;
            let n = match round % 4 {
                0 => 128 * 1024,
                1 => 32 * 1024,
                2 => rng.random_range(1..4096) * 2,
                _ => rng.random_range(1..64 * 1024) * 2,
            };
            let level = [1, 3, 7, 19, -5][rng.random_range(0..5)];
            let plain = data(kind, n, &mut rng);
            let frame = zstd::bulk::compress(&plain, level).unwrap();
            by_kind[kind] += check(&plain, &frame, &mut rng, 12).0;
        }
        // Imagery (with and without repeats), random, constant and text blocks (thousands of
        // sequences) all take this path.
        for (kind, &n) in by_kind.iter().enumerate() {
            assert!(n > 100, "kind {kind}: only {n} partial decodes");
        }
    }

    /// `len` bytes of imagery made from `seed`, and their zstd frame at level 1.
    fn imagery_frame(seed: u64, len: usize) -> (Vec<u8>, Vec<u8>) {
        let plain = imagery(len, &mut StdRng::seed_from_u64(seed));
        let frame = zstd::bulk::compress(&plain, 1).unwrap();
        (plain, frame)
    }

    #[test]
    fn decodes_only_the_streams_a_band_needs() {
        let (plain, frame) = imagery_frame(2, 128 * 1024);
        let mut out = vec![0u8; plain.len()];
        let mut scratch = Vec::new();
        // A band in the third quarter: only the third literal stream is decoded, and only up
        // to the band's end.
        let want = 80 * 1024..90 * 1024;
        let got =
            decode_range(&frame, &mut out, want.clone(), &mut scratch, f64::INFINITY).unwrap();
        assert_eq!(got, 64 * 1024..90 * 1024);
        assert_eq!(out[want.clone()], plain[want]);
        // Bytes outside what was decoded are untouched.
        assert!(out[..64 * 1024].iter().all(|&b| b == 0));
        assert!(out[90 * 1024..].iter().all(|&b| b == 0));
    }

    /// A block of thousands of sequences: a band near its start decodes only the sequences up
    /// to it; one near its end would need them all, which costs more than libzstd.
    #[test]
    fn sequences_are_decoded_up_to_the_band_and_priced() {
        let plain = text(32 * 1024, &mut StdRng::seed_from_u64(6));
        let frame = zstd::bulk::compress(&plain, 3).unwrap();
        let block = read_frame(&frame).unwrap().block;
        let (literals, n) = read_literals(block).unwrap();
        let all = read_sequences(&block[n..], literals.count(), plain.len(), usize::MAX).unwrap();
        assert!(
            all.complete() && all.count > 2000,
            "{} sequences",
            all.count
        );
        let head = read_sequences(&block[n..], literals.count(), plain.len(), 1000).unwrap();
        assert!(!head.complete() && head.list.len() < all.count / 10);
        assert!(head.produced >= 1000);
        let mut out = vec![0u8; plain.len()];
        let got = decode_range(&frame, &mut out, 0..1000, &mut Vec::new(), MAX_SHARE).unwrap();
        assert_eq!(out[..1000], plain[..1000]);
        assert!(got.end < 2000, "{got:?}");
        let tail = plain.len() - 1000..plain.len();
        assert_eq!(
            decode_range(&frame, &mut out, tail, &mut Vec::new(), MAX_SHARE),
            Err(Error::Unsupported(TOO_MANY_SEQUENCES))
        );
    }

    /// The Huffman table is built only for blocks decoded here: a damaged tree description is
    /// an error for a band decoded here, and a block left to libzstd never reads it.
    #[test]
    fn huffman_tables_are_read_only_for_blocks_decoded_here() {
        let (plain, mut frame) = imagery_frame(5, 32 * 1024);
        let block = read_frame(&frame).unwrap().block;
        let Literals::Huffman { tree, .. } = read_literals(block).unwrap().0 else {
            panic!("imagery literals are Huffman-coded");
        };
        assert!(tree[0] < 128, "weights are FSE-coded");
        let at = tree.as_ptr() as usize - frame.as_ptr() as usize;
        let len = tree.len();
        // Zero FSE counts: a description no table can be built from.
        frame[at + 1..at + len].fill(0);
        let mut out = vec![0u8; plain.len()];
        let band = 100..200;
        match decode_range(&frame, &mut out, band, &mut Vec::new(), f64::INFINITY) {
            Err(Error::Corrupt(e)) => assert!(e.contains("Huffman weights"), "{e}"),
            other => panic!("damaged tree decoded: {other:?}"),
        }
        let whole = 0..plain.len();
        assert_eq!(
            decode_range(&frame, &mut out, whole, &mut Vec::new(), MAX_SHARE),
            Err(Error::Unsupported("most of the block is needed"))
        );
    }

    #[test]
    fn several_blocks_and_dictionaries_are_left_to_libzstd() {
        let (plain, frame) = imagery_frame(3, 300 * 1024);
        let mut out = vec![0u8; plain.len()];
        let r = decode_range(&frame, &mut out, 0..10, &mut Vec::new(), f64::INFINITY);
        assert_eq!(r, Err(Error::Unsupported("frame of several blocks")));
        // A frame header that names dictionary 5 (one id byte).
        let small = &plain[..4096];
        let plain_frame = zstd::bulk::compress(small, 1).unwrap();
        let fhd = plain_frame[4];
        assert_eq!(fhd & 3, 0);
        let mut frame = plain_frame[..4].to_vec();
        frame.push(fhd | 1);
        let window = usize::from(fhd & 0x20 == 0);
        frame.extend_from_slice(&plain_frame[5..5 + window]);
        frame.push(5);
        frame.extend_from_slice(&plain_frame[5 + window..]);
        let mut out = vec![0u8; small.len()];
        let r = decode_range(&frame, &mut out, 0..10, &mut Vec::new(), f64::INFINITY);
        assert_eq!(r, Err(Error::Unsupported("frame needs a dictionary")));
    }

    #[test]
    fn damaged_frames_give_errors_or_bytes_never_a_panic() {
        let mut rng = StdRng::seed_from_u64(4);
        let mut scratch = Vec::new();
        let mut corrupt_seen = 0;
        for round in 0..3000 {
            let n = [128 * 1024, 32 * 1024, 2048][round % 3];
            let plain = data(round % 5, n, &mut rng);
            let mut frame = zstd::bulk::compress(&plain, [1, 3, 19][round % 3]).unwrap();
            match rng.random_range(0..3) {
                0 => frame.truncate(rng.random_range(0..frame.len())),
                1 => {
                    for _ in 0..rng.random_range(1..4) {
                        let i = rng.random_range(0..frame.len());
                        frame[i] ^= 1 << rng.random_range(0..8);
                    }
                }
                _ => {
                    let i = rng.random_range(0..frame.len());
                    frame[i] = rng.random();
                }
            }
            let mut out = vec![0u8; n];
            let a = rng.random_range(0..n);
            let want = a..rng.random_range(a..=n);
            if let Err(Error::Corrupt(_)) =
                decode_range(&frame, &mut out, want, &mut scratch, f64::INFINITY)
            {
                corrupt_seen += 1;
            }
        }
        assert!(
            corrupt_seen > 500,
            "only {corrupt_seen} damaged frames detected"
        );
    }

    #[test]
    fn fse_tables_fill_as_libzstd_spreads_them() {
        // The predefined literal-length table (RFC 8878, appendix A): state 0 is symbol 0 with
        // 4 bits, state 63 (the last "less than one" symbol placed first) is symbol 32.
        let t = Fse::build(&LL_DEFAULT, 6).unwrap();
        assert_eq!(
            (t.table[0].symbol, t.table[0].nb_bits, t.table[0].new_state),
            (0, 4, 0)
        );
        assert_eq!(
            (t.table[1].symbol, t.table[1].nb_bits, t.table[1].new_state),
            (0, 4, 16)
        );
        assert_eq!((t.table[2].symbol, t.table[2].nb_bits), (1, 5));
        assert_eq!((t.table[63].symbol, t.table[63].nb_bits), (32, 6));
        assert_eq!((t.table[60].symbol, t.table[60].nb_bits), (35, 6));
    }
}
