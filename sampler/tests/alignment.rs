//! Origins from label tables (`Dim::lookup`) and crops that take every k-th element
//! (`Dim::every`): the drawn positions are exactly those every table aligns, and the bytes are
//! the strided numpy slices at the reported origins.

mod common;

use std::collections::HashSet;

use common::{fixture, strided};
use proptest::prelude::*;
use zcrop_sampler::{Dim, Mode, SampleSpec, Sampler, SamplerError, Shard, Source, Transform};

/// Whether a looked-up origin `t` keeps a crop spanning `span` inside `size` with `jitter`.
fn fits(t: i64, size: u64, span: u64, jitter: u64) -> bool {
    t >= 0 && t as u64 >= jitter && t as u64 + jitter + span <= size
}

#[derive(Debug, Clone)]
struct Case {
    table_t: Vec<i64>,
    table_y: Vec<i64>,
    crop: [u64; 4],
    every: [u64; 4],
    jitter_y: u64,
}

fn case() -> impl Strategy<Value = Case> {
    // The fixture is (6, 3, 70, 90): tables over 6 times and 70 rows, entries -1 (no
    // alignment) up to past the end, so some positions are excluded either way.
    let table = |n: usize, hi: i64| prop::collection::vec(-1i64..hi, n);
    (
        table(6, 7),
        table(70, 72),
        (1u64..=3, 1u64..=3, 1u64..=6, 1u64..=5),
        (1u64..=2, 1u64..=2, 1u64..=4, 1u64..=3),
        0u64..=2,
    )
        .prop_map(
            |(table_t, table_y, (ct, cc, cy, cx), (et, ec, ey, ex), jitter_y)| Case {
                table_t,
                table_y,
                crop: [ct, cc, cy, cx],
                every: [et, ec, ey, ex],
                jitter_y,
            },
        )
}

fn spec(c: &Case) -> SampleSpec {
    let (sat, _, _) = fixture("v3_workload_4d_u2");
    SampleSpec::new(["t", "y", "x"])
        .source(Source::new("ref", sat.clone(), [1, 3, 8, 8]))
        .source(
            Source::new("looked", sat, c.crop).dims([
                Dim::lookup("t", c.table_t.clone()).every(c.every[0]),
                Dim::fixed(0).every(c.every[1]),
                Dim::lookup("y", c.table_y.clone())
                    .jitter(c.jitter_y)
                    .every(c.every[2]),
                Dim::along("x").every(c.every[3]),
            ]),
        )
}

/// Positions `(t, y, x)` every source aligns: the expected sample space.
fn allowed(c: &Case) -> Option<HashSet<(u64, u64, u64)>> {
    let shape = [6u64, 3, 70, 90];
    let span = |d: usize| (c.crop[d] - 1) * c.every[d] + 1;
    if span(1) > shape[1] {
        return None;
    }
    let mut out = HashSet::new();
    for t in 0..6u64 {
        for y in 0..=(70 - 8) {
            for x in 0..=(90 - 8u64) {
                let ok = fits(c.table_t[t as usize], shape[0], span(0), 0)
                    && fits(c.table_y[y as usize], shape[2], span(2), c.jitter_y)
                    && x + span(3) <= shape[3];
                if ok {
                    out.insert((t, y, x));
                }
            }
        }
    }
    Some(out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn lookups_draw_only_aligned_positions_and_read_strided_slices(c in case()) {
        let Some(want) = allowed(&c) else {
            prop_assert!(Sampler::new(spec(&c)).is_err());
            return Ok(());
        };
        let built = Sampler::new(spec(&c).mode(Mode::Epoch { stride: vec![1, 1, 1] }));
        if want.is_empty() {
            prop_assert!(matches!(built, Err(SamplerError::EmptyRegion { .. } | SamplerError::Spec { .. })), "{built:?}");
            return Ok(());
        }
        // Epoch mode enumerates the space: exactly the aligned positions.
        let epoch = built.unwrap();
        prop_assert_eq!(epoch.epoch_len(), want.len() as u64);
        let got: HashSet<(u64, u64, u64)> = epoch
            .sample_positions(0, epoch.epoch_len())
            .unwrap()
            .chunks_exact(3)
            .map(|p| (p[0], p[1], p[2]))
            .collect();
        prop_assert_eq!(&got, &want);

        let (_, data, shape) = fixture("v3_workload_4d_u2");
        let sampler = Sampler::new(spec(&c).seed(3).batch_size(4)).unwrap();
        for step in 0..3 {
            let plan = sampler.plan(step, Shard::SINGLE).unwrap();
            let bytes = sampler.read(&plan).unwrap();
            for i in 0..plan.len() {
                let p = plan.position(i);
                prop_assert!(want.contains(&(p[0], p[1], p[2])));
                let o = &common::unsigned(plan.origin(1, i));
                prop_assert_eq!(o[0] as i64, c.table_t[p[0] as usize]);
                prop_assert_eq!(o[1], 0);
                prop_assert!((o[2] as i64 - c.table_y[p[1] as usize]).unsigned_abs() <= c.jitter_y);
                prop_assert_eq!(o[3], p[2]);
                let expect = strided(&data, &shape, 2, o, &c.crop, &c.every);
                let n = expect.len();
                prop_assert_eq!(&bytes[1][i * n..(i + 1) * n], &expect[..], "sample {}", i);
                let meta = plan.sample(i);
                prop_assert_eq!(&meta.sources[1].origin, plan.origin(1, i));
            }
        }
    }
}

/// A stepped crop converts and normalises like a contiguous one, element for element.
#[test]
fn stepped_crops_take_the_transform_along_other_axes() {
    let (sat, data, shape) = fixture("v3_workload_4d_u2");
    let norm = Transform::to_f32().normalize(1, vec![1.0, 2.0, 3.0], vec![2.0, 4.0, 8.0]);
    let spec = SampleSpec::new(["t", "y", "x"])
        .source(Source::new("s", sat, [2, 3, 4, 5]).transform(norm).dims([
            Dim::along("t").every(3),
            Dim::fixed(0),
            Dim::along("y").every(5),
            Dim::along("x"),
        ]))
        .batch_size(3);
    let sampler = Sampler::new(spec).unwrap();
    let plan = sampler.plan(0, Shard::SINGLE).unwrap();
    let got = sampler.read(&plan).unwrap();
    for i in 0..3 {
        let origin = &common::unsigned(plan.origin(0, i));
        let raw = strided(&data, &shape, 2, origin, &[2, 3, 4, 5], &[3, 1, 5, 1]);
        let want: Vec<u8> = raw
            .chunks_exact(2)
            .enumerate()
            .flat_map(|(k, b)| {
                let c = (k / 20) % 3;
                let v = f32::from(u16::from_ne_bytes([b[0], b[1]]));
                let (m, s) = ([1.0f32, 2.0, 3.0][c], [2.0f32, 4.0, 8.0][c]);
                ((v - m) / s).to_ne_bytes()
            })
            .collect();
        let n = want.len();
        assert_eq!(&got[0][i * n..(i + 1) * n], &want[..], "sample {i}");
    }
}

#[test]
fn bad_steps_and_tables_are_errors() {
    let (sat, _, _) = fixture("v3_workload_4d_u2");
    let with = |dims: Vec<Dim>, t: Transform| {
        Sampler::new(
            SampleSpec::new(["t", "y", "x"]).source(
                Source::new("s", sat.clone(), [2, 3, 4, 4])
                    .dims(dims)
                    .transform(t),
            ),
        )
    };
    let dims = |t: Dim| vec![t, Dim::fixed(0), Dim::along("y"), Dim::along("x")];
    let msg = |r: Result<Sampler, SamplerError>| r.unwrap_err().to_string();
    assert!(msg(with(dims(Dim::along("t").every(0)), Transform::none())).contains("every 0th"));
    assert!(msg(with(dims(Dim::along("t").every(6)), Transform::none())).contains("spans more"));
    let e = msg(with(
        dims(Dim::along("t").every(2)),
        Transform::to_f32().normalize(0, vec![0.0; 2], vec![1.0; 2]),
    ));
    assert!(e.contains("contiguous dimension"), "{e}");
    let e = msg(with(
        dims(Dim::lookup("t", vec![-1, 5, 9])),
        Transform::none(),
    ));
    assert!(
        e.contains("aligns with no position") && e.contains("\"s\""),
        "{e}"
    );
    let e = msg(with(
        dims(Dim::lookup("t", vec![0, 1]).scale(1, 2)),
        Transform::none(),
    ));
    assert!(e.contains("takes no scale"), "{e}");
}

/// A picked dimension takes its indices in the given order, with steps on other axes.
#[test]
fn picked_indices_are_gathered_in_order() {
    let (sat, data, shape) = fixture("v3_workload_4d_u2");
    for (picks, every_y) in [(vec![2u64, 0], 1u64), (vec![1, 1, 2], 3), (vec![1], 2)] {
        let n = picks.len() as u64;
        let spec = SampleSpec::new(["t", "y", "x"])
            .source(Source::new("s", sat.clone(), [2, n, 4, 5]).dims([
                Dim::along("t"),
                Dim::pick(picks.clone()),
                Dim::along("y").every(every_y),
                Dim::along("x"),
            ]))
            .batch_size(4);
        let sampler = Sampler::new(spec).unwrap();
        let plan = sampler.plan(1, Shard::SINGLE).unwrap();
        let got = sampler.read(&plan).unwrap();
        for i in 0..4 {
            let o = &common::unsigned(plan.origin(0, i));
            let mut want = Vec::new();
            for t in 0..2 {
                for &c in &picks {
                    let origin = [o[0] + t, c, o[2], o[3]];
                    want.extend(strided(
                        &data,
                        &shape,
                        2,
                        &origin,
                        &[1, 1, 4, 5],
                        &[1, 1, every_y, 1],
                    ));
                }
            }
            let len = want.len();
            assert_eq!(
                &got[0][i * len..(i + 1) * len],
                &want[..],
                "{picks:?} sample {i}"
            );
        }
    }
    let bad = |dim: Dim, crop: u64| {
        Sampler::new(SampleSpec::new(["t", "y", "x"]).source(
            Source::new("s", sat.clone(), [1, crop, 4, 4]).dims([
                Dim::along("t"),
                dim,
                Dim::along("y"),
                Dim::along("x"),
            ]),
        ))
        .unwrap_err()
        .to_string()
    };
    assert!(bad(Dim::pick(vec![0, 3]), 2).contains("past its size 3"));
    assert!(bad(Dim::pick(vec![0, 1]), 3).contains("picks 2 indices for a crop of 3"));
}

/// A periodic dimension: origins anywhere along it, crops across its end continue at 0, in
/// batches mixing crops that wrap (at different splits) and crops that do not.
#[test]
fn periodic_dimensions_wrap_around() {
    let (sat, data, shape) = fixture("v3_workload_4d_u2");
    let spec = SampleSpec::new(["t", "y", "x"])
        .source(Source::new("s", sat, [1, 3, 4, 24]).dims([
            Dim::along("t"),
            Dim::fixed(0),
            Dim::along("y"),
            Dim::along("x").jitter(3).wrap(),
        ]))
        .seed(5)
        .batch_size(16);
    let sampler = Sampler::new(spec).unwrap();
    let (start, end) = sampler.position_box();
    assert_eq!((start[2], end[2]), (0, 90), "every x is a position");
    let mut wrapped = 0;
    for step in 0..8 {
        let plan = sampler.plan(step, Shard::SINGLE).unwrap();
        let got = sampler.read(&plan).unwrap();
        for i in 0..16 {
            let o = &common::unsigned(plan.origin(0, i));
            assert!(o[3] < 90);
            wrapped += usize::from(o[3] + 24 > 90);
            let mut want = Vec::new();
            for c in 0..3 {
                for y in 0..4 {
                    for x in 0..24 {
                        let at = [o[0], c, o[2] + y, (o[3] + x) % 90];
                        want.extend(strided(&data, &shape, 2, &at, &[1, 1, 1, 1], &[1, 1, 1, 1]));
                    }
                }
            }
            let n = want.len();
            assert_eq!(
                &got[0][i * n..(i + 1) * n],
                &want[..],
                "step {step} sample {i}"
            );
        }
    }
    assert!(wrapped > 10, "{wrapped} crops wrapped");
    let bad = Sampler::new(
        SampleSpec::new(["t", "y", "x"]).source(
            Source::new("s", fixture("v3_workload_4d_u2").0, [1, 3, 4, 4])
                .dims([
                    Dim::along("t"),
                    Dim::fixed(0),
                    Dim::along("y"),
                    Dim::along("x").wrap(),
                ])
                .transform(Transform::to_f32().fft(vec![3], zcrop_sampler::Spectrum::Power)),
        ),
    );
    assert!(bad.unwrap_err().to_string().contains("periodic"));
}

/// The crop wanted at `origin` (signed) built element by element: array elements where they
/// exist (indices `origin + k * every`, periodic along `wrap`), `None` outside.
fn padded_oracle(
    data: &[u8],
    shape: &[u64],
    es: usize,
    origin: &[i64],
    crop: &[u64],
    every: &[u64],
    wrap: Option<usize>,
) -> Vec<Option<Vec<u8>>> {
    let n: u64 = crop.iter().product();
    let mut idx = vec![0u64; crop.len()];
    (0..n)
        .map(|lin| {
            let mut rem = lin;
            for d in (0..crop.len()).rev() {
                idx[d] = rem % crop[d];
                rem /= crop[d];
            }
            let mut at = Vec::with_capacity(crop.len());
            for d in 0..crop.len() {
                let i = origin[d] + (idx[d] * every[d]) as i64;
                let i = if wrap == Some(d) {
                    i.rem_euclid(shape[d] as i64)
                } else {
                    i
                };
                if !(0..shape[d] as i64).contains(&i) {
                    return None;
                }
                at.push(i as u64);
            }
            Some(strided(
                data,
                shape,
                es,
                &at,
                &vec![1; crop.len()],
                &vec![1; crop.len()],
            ))
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Padded dimensions: positions cover every index, crops past either end hold the fill
    /// value there and the array's elements elsewhere, with steps, jitter, a lookup table and a
    /// periodic neighbour; origins are reported signed.
    #[test]
    fn padded_crops_hold_the_fill_outside_the_array(
        (cy, cx) in (1u64..=12, 1u64..=30),
        (ey, ex) in (1u64..=3, 1u64..=2),
        (oy, jy) in (-12i64..=2, 0u64..=3),
        wrap_x in any::<bool>(),
        to_f32 in any::<bool>(),
        fill in prop::option::of(0u16..=9),
        table in prop::collection::vec(-1i64..90, 90),
        seed in 0u64..1000,
    ) {
        let (sat, data, shape) = fixture("v3_workload_4d_u2");
        // A periodic dimension takes contiguous crops.
        let ex = if wrap_x { 1 } else { ex };
        let x = if wrap_x {
            Dim::along("x").wrap()
        } else {
            Dim::lookup("x", table.clone()).offset(-3).every(ex)
        };
        let mut src = Source::new("s", sat, [2, 1, cy, cx])
            .dims([
                Dim::along("t"),
                Dim::fixed(1),
                Dim::along("y").offset(oy).jitter(jy).every(ey),
                x,
            ])
            .pad(2);
        if !wrap_x {
            src = src.pad(3);
        }
        if to_f32 {
            src = src.transform(Transform::to_f32());
        }
        if let Some(f) = fill {
            src = src.fill(f64::from(f));
        }
        let sampler = Sampler::new(SampleSpec::new(["t", "y", "x"]).source(src).seed(seed).batch_size(12))
            .unwrap();
        let (start, end) = sampler.position_box();
        prop_assert_eq!((start[1], end[1]), (0, 70), "every row is a position");
        let drawn_x: Vec<u64> = (0..90u64).filter(|&p| wrap_x || table[p as usize] >= 0).collect();
        prop_assert_eq!((start[2], end[2]), (drawn_x[0], drawn_x[drawn_x.len() - 1] + 1));
        let crop = [2, 1, cy, cx];
        let every = [1, 1, ey, ex];
        let es = if to_f32 { 4 } else { 2 };
        let fill_bytes = match (fill, to_f32) {
            (Some(f), false) => f.to_ne_bytes().to_vec(),
            (Some(f), true) => f32::from(f).to_ne_bytes().to_vec(),
            (None, false) => 0u16.to_ne_bytes().to_vec(),
            (None, true) => f32::NAN.to_ne_bytes().to_vec(),
        };
        let (mut outside, mut past_y) = (0, 0);
        let reach_y = ((cy - 1) * ey + 1) as i64;
        for step in 0..4 {
            let plan = sampler.plan(step, Shard::SINGLE).unwrap();
            let got = sampler.read(&plan).unwrap();
            for i in 0..plan.len() {
                let p = plan.position(i);
                let o = plan.origin(0, i);
                prop_assert!((o[2] - (p[1] as i64 + oy)).unsigned_abs() <= jy);
                if o[2] < 0 || o[2] + reach_y > shape[2] as i64 {
                    past_y += 1;
                }
                if !wrap_x {
                    prop_assert!(table[p[2] as usize] >= 0);
                    prop_assert_eq!(o[3], table[p[2] as usize] - 3);
                }
                let want = padded_oracle(&data, &shape, 2, o, &crop, &every, wrap_x.then_some(3));
                let n = want.len() * es;
                let got = &got[0][i * n..(i + 1) * n];
                for (k, w) in want.iter().enumerate() {
                    let g = &got[k * es..(k + 1) * es];
                    match w {
                        None => {
                            outside += 1;
                            prop_assert_eq!(g, &fill_bytes[..], "sample {} element {}", i, k);
                        }
                        Some(v) if to_f32 => {
                            let v = f32::from(u16::from_ne_bytes([v[0], v[1]]));
                            prop_assert_eq!(g, &v.to_ne_bytes()[..], "sample {} element {}", i, k);
                        }
                        Some(v) => prop_assert_eq!(g, &v[..], "sample {} element {}", i, k),
                    }
                }
                prop_assert_eq!(&plan.sample(i).sources[0].origin, o);
            }
        }
        // Whether a draw lands near an end is chance; a crop that does reads fill there.
        if past_y > 0 {
            prop_assert!(outside > 0, "{} crops passed an end along y, none read fill", past_y);
        }
    }
}

#[test]
fn padding_is_refused_where_it_cannot_apply() {
    let bad = |src: Source| {
        Sampler::new(SampleSpec::new(["t", "y", "x"]).source(src))
            .unwrap_err()
            .to_string()
    };
    let (sat, _, _) = fixture("v3_workload_4d_u2");
    let s = || Source::new("s", sat.clone(), [1, 3, 4, 4]);
    assert!(bad(s().pad(1)).contains("dimension 1 cannot be padded: it follows no position"));
    assert!(bad(s().pad(7)).contains("the array has 4 dimensions"));
    let fft = Transform::to_f32().fft(vec![3], zcrop_sampler::Spectrum::Power);
    assert!(bad(s().pad(2).transform(fft)).contains("FFT"));
    assert!(
        bad(s()
            .pad(2)
            .transform(Transform::to_f32().normalize(2, vec![0.0; 4], vec![1.0; 4])))
        .contains("normalize")
    );
    assert!(bad(s().pad(2).fill(-1.0)).contains("not a uint16 value"));
    assert!(bad(s().pad(2).fill(f64::NAN)).contains("not a uint16 value"));
    let wrapped = s().dims([
        Dim::along("t"),
        Dim::fixed(0),
        Dim::along("y"),
        Dim::along("x").wrap(),
    ]);
    assert!(bad(wrapped.pad(3)).contains("periodic"));
    let stepped = Source::new("s", sat.clone(), [1, 3, 24, 4])
        .dims([
            Dim::along("t"),
            Dim::fixed(0),
            Dim::along("y").every(3),
            Dim::along("x"),
        ])
        .pad(2);
    assert!(bad(stepped).contains("needs 72 elements of it to be placed, and it has 70"));
}
