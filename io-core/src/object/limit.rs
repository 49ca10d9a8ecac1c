//! How many GETs an engine keeps in flight: a limit that adapts to what the store answers.
//!
//! A far store needs many requests in flight to keep its link busy (Little's law: requests
//! per second = requests in flight / latency), but more than the store or the link can serve
//! only queue. The limit follows a latency gradient, as TCP Vegas and Netflix's
//! `concurrency-limits` do. While GETs take at most [`TOLERANCE`] times as long as the quickest
//! recent ones, each GET that finishes adds one slot, so the limit doubles every round trip
//! (TCP's slow start). When they take longer (the store queues them, or they share a saturated
//! link), each takes some away, a quarter of the limit per round trip at most. A 503 or 429
//! answer cuts it by [`THROTTLE_CUT`] at once. It grows only while the engine keeps at least
//! half of it busy, so a light load does not leave a limit no store was tried at.
//!
//! The same measurements size coalescing ([`Limiter::max_gap`]): a hole of `g` bytes read
//! with a GET costs `g / bandwidth` of the link. A GET of its own costs [`GET_COST`] of
//! processing while the limit can still grow; once it is at its ceiling, slots are what the
//! engine runs short of, and a GET costs one for a round trip, `latency / limit` of the
//! engine's time. Holes merge while smaller than `bandwidth` times that cost: the
//! bandwidth-delay product per slot where requests are scarce, a few kilobytes on a link that
//! is full. Holes of up to [`MIN_GAP`] always merge: the bandwidth measured is what GETs
//! delivered, and a few small GETs from a slow store would otherwise pass for a slow link.
//!
//! And they say when a GET is late ([`Limiter::hedge_delay`]): past the 95th percentile of
//! recent first bytes, and past [`HEDGE_OVER_MEDIAN`] times their median, so that a store whose
//! answers all take about as long is not sent duplicates.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::sync::{Mutex, MutexGuard};

/// GETs may take this many times as long as the quickest recent ones before the limit falls.
pub(crate) const TOLERANCE: f64 = 2.0;
/// The limit after a 503 or 429, as a share of what it was.
pub(crate) const THROTTLE_CUT: f64 = 0.7;
/// The slots one slow GET takes away at the steepest gradient (0.5): a quarter of the limit
/// per round trip, when every GET of the round is slow.
const DECREASE: f64 = 0.5;
/// The weight of each new GET in the recent GET time.
const RECENT_WEIGHT: f64 = 0.125;
/// Holes of up to this many bytes always merge (about a GET's request and answer headers).
const MIN_GAP: u64 = 4096;
/// GETs per window of the quickest-recent-time minimum. It spans this window and the one
/// before, so a store that became slower for good (a longer route) is the new quickest within
/// two windows.
const WINDOW: u32 = 512;
/// What a GET costs beyond its bytes when round trips cost nothing (a store next door): the
/// order of the client's and the server's processing of one request.
pub(crate) const GET_COST: Duration = Duration::from_micros(100);
/// First-byte times kept for the hedging delay.
const HEDGE_SAMPLES: usize = 256;
/// The hedging delay is computed again every this many GETs, once there are enough.
const HEDGE_EVERY: usize = 32;
/// A GET is hedged only once this many times the median first byte has passed.
pub(crate) const HEDGE_OVER_MEDIAN: f64 = 1.5;
/// The bandwidth is measured over windows of at least this long.
const METER_WINDOW: Duration = Duration::from_millis(200);
/// Each window, the highest bandwidth measured keeps this share (so it follows a link that
/// became slower within a few seconds).
const METER_DECAY: f64 = 0.9;

/// The concurrency limit of one engine and the slots that enforce it.
#[derive(Debug)]
pub(crate) struct Limiter {
    slots: Arc<Semaphore>,
    min: usize,
    max: usize,
    adaptive: bool,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    limit: f64,
    /// Slots that exist: free in the semaphore or held by a GET.
    slots: usize,
    /// Slots to retire as their GETs finish (the limit fell below the slots held).
    retire: usize,
    /// Exponentially weighted GET time, seconds.
    recent: Option<f64>,
    /// The least `recent` of this window and the one before.
    window_min: f64,
    previous_min: f64,
    window_len: u32,
    /// The quickest first byte (answer headers) of this window and the one before, seconds.
    first_byte_min: f64,
    first_byte_previous: f64,
    /// Recent first-byte times (a ring), how many were taken, and the delay after which a GET
    /// is hedged (none until there are enough).
    first_bytes: Vec<f64>,
    first_bytes_seen: usize,
    hedge_after: Option<Duration>,
    /// Throttling answers seen so far (503, 429), to notice new ones.
    throttled: u64,
    /// Bytes received and time spent busy in this measuring window, and when the last GET
    /// finished.
    meter_bytes: u64,
    meter_busy: Duration,
    meter_last: Instant,
    /// The highest bandwidth measured (bytes per second), decaying.
    bandwidth: Option<f64>,
}

/// One GET's slot; give it back with [`Slot::finish`] (dropping it frees it unmeasured).
#[derive(Debug)]
pub(crate) struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    limiter: Arc<Limiter>,
}

impl Limiter {
    /// A limit between `min` and `max` starting at `initial`, or fixed at `max` when not
    /// `adaptive`.
    pub(crate) fn new(initial: usize, min: usize, max: usize, adaptive: bool) -> Arc<Limiter> {
        let max = max.max(1);
        let min = min.clamp(1, max);
        let start = if adaptive {
            initial.clamp(min, max)
        } else {
            max
        };
        Arc::new(Limiter {
            slots: Arc::new(Semaphore::new(start)),
            min,
            max,
            adaptive,
            state: Mutex::new(State {
                limit: start as f64,
                slots: start,
                retire: 0,
                recent: None,
                window_min: f64::INFINITY,
                previous_min: f64::INFINITY,
                window_len: 0,
                first_byte_min: f64::INFINITY,
                first_byte_previous: f64::INFINITY,
                first_bytes: Vec::with_capacity(HEDGE_SAMPLES),
                first_bytes_seen: 0,
                hedge_after: None,
                throttled: 0,
                meter_bytes: 0,
                meter_busy: Duration::ZERO,
                meter_last: Instant::now(),
                bandwidth: None,
            }),
        })
    }

    /// The limit now (GETs in flight at most).
    pub(crate) fn limit(&self) -> usize {
        let s = self.state();
        s.slots - s.retire
    }

    /// The largest the limit can be.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Waits for a slot; `None` when the semaphore is closed (never, in practice).
    pub(crate) async fn acquire(self: &Arc<Self>) -> Option<Slot> {
        let permit = Arc::clone(&self.slots).acquire_owned().await.ok()?;
        Some(Slot {
            permit: Some(permit),
            limiter: Arc::clone(self),
        })
    }

    /// GETs holding a slot now.
    pub(crate) fn in_flight(&self) -> usize {
        let s = self.state();
        s.slots.saturating_sub(self.slots.available_permits())
    }

    /// The largest hole worth reading to save a GET, at most `max` and at least [`MIN_GAP`]
    /// (or `max` when smaller): `max` until the bandwidth and the latency are measured (see the
    /// module's documentation).
    pub(crate) fn max_gap(&self, max: u64) -> u64 {
        let s = self.state();
        let latency = s.first_byte_min.min(s.first_byte_previous);
        match s.bandwidth {
            Some(bw) if latency.is_finite() => {
                let mut per_get = GET_COST.as_secs_f64();
                if s.limit >= self.max as f64 {
                    per_get = per_get.max(latency / s.limit);
                }
                ((bw * per_get) as u64).max(MIN_GAP).min(max)
            }
            _ => max,
        }
    }

    /// How long to wait for a GET's first byte before sending it again: the 95th percentile of
    /// recent first bytes, at least [`HEDGE_OVER_MEDIAN`] times their median; `None` until 64
    /// GETs have been timed.
    pub(crate) fn hedge_delay(&self) -> Option<Duration> {
        self.state().hedge_after
    }

    /// Takes in a finished GET: how long it and its first byte took (`None` when it failed),
    /// how many bytes it brought and how many throttling answers the store has given so far.
    fn observe(
        &self,
        took: Option<Duration>,
        first_byte: Option<Duration>,
        bytes: u64,
        throttled: u64,
        busy: usize,
    ) {
        let mut s = self.state();
        Self::meter(&mut s, bytes, busy);
        let recent = took.map(|t| Self::time(&mut s, t, first_byte));
        if !self.adaptive {
            return;
        }
        if throttled > s.throttled {
            s.throttled = throttled;
            s.limit = (s.limit * THROTTLE_CUT).max(self.min as f64);
            self.resize(&mut s);
            return;
        }
        let Some(recent) = recent else { return };
        let quickest = s.window_min.min(s.previous_min);
        let gradient = (TOLERANCE * quickest / recent).clamp(0.5, 1.0);
        if gradient < 1.0 {
            s.limit -= DECREASE * (1.0 - gradient);
        } else if busy * 2 >= s.slots {
            // Grow only while the load fills at least half the limit.
            s.limit += 1.0;
        }
        s.limit = s.limit.clamp(self.min as f64, self.max as f64);
        self.resize(&mut s);
    }

    /// Takes in a successful GET's times; returns the recent GET time.
    fn time(s: &mut State, took: Duration, first_byte: Option<Duration>) -> f64 {
        let t = took.as_secs_f64();
        let recent = s.recent.map_or(t, |r| r + RECENT_WEIGHT * (t - r));
        s.recent = Some(recent);
        s.window_min = s.window_min.min(recent);
        let first = first_byte.map_or(t, |f| f.as_secs_f64());
        s.first_byte_min = s.first_byte_min.min(first);
        if s.first_bytes.len() < HEDGE_SAMPLES {
            s.first_bytes.push(first);
        } else {
            let at = s.first_bytes_seen % HEDGE_SAMPLES;
            s.first_bytes[at] = first;
        }
        s.first_bytes_seen += 1;
        if s.first_bytes.len() >= 64 && s.first_bytes_seen.is_multiple_of(HEDGE_EVERY) {
            let mut sorted = s.first_bytes.clone();
            sorted.sort_by(f64::total_cmp);
            let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q) as usize];
            let delay = at(0.95).max(HEDGE_OVER_MEDIAN * at(0.5));
            s.hedge_after = Some(Duration::from_secs_f64(delay));
        }
        s.window_len += 1;
        if s.window_len >= WINDOW {
            s.previous_min = s.window_min;
            s.window_min = recent;
            s.first_byte_previous = s.first_byte_min;
            s.first_byte_min = first;
            s.window_len = 0;
        }
        recent
    }

    /// Counts `bytes` towards the bandwidth, over the time some GET was in flight.
    fn meter(s: &mut State, bytes: u64, busy: usize) {
        let now = Instant::now();
        if busy > 0 {
            s.meter_bytes += bytes;
            s.meter_busy += now - s.meter_last;
        }
        s.meter_last = now;
        if s.meter_busy >= METER_WINDOW {
            let rate = s.meter_bytes as f64 / s.meter_busy.as_secs_f64();
            s.bandwidth = Some(s.bandwidth.map_or(rate, |b| rate.max(b * METER_DECAY)));
            s.meter_bytes = 0;
            s.meter_busy = Duration::ZERO;
        }
    }

    /// Makes the slots match the limit: new ones added at once, surplus free ones removed at
    /// once and held ones retired as their GETs finish.
    fn resize(&self, s: &mut State) {
        let want = s.limit.round() as usize;
        let have = s.slots - s.retire;
        if want > have {
            let mut add = want - have;
            let unretire = add.min(s.retire);
            s.retire -= unretire;
            add -= unretire;
            self.slots.add_permits(add);
            s.slots += add;
        } else if want < have {
            let surplus = have - want;
            let forgotten = self.slots.forget_permits(surplus);
            s.slots -= forgotten;
            s.retire += surplus - forgotten;
        }
    }
}

impl Slot {
    /// Gives the slot back with what its GET did: how long it and its first byte took (`None`
    /// when it failed), the bytes it brought, and the throttling answers the store has given
    /// so far.
    pub(crate) fn finish(
        mut self,
        took: Option<Duration>,
        first_byte: Option<Duration>,
        bytes: u64,
        throttled: u64,
    ) {
        let limiter = Arc::clone(&self.limiter);
        let busy = {
            let s = limiter.state();
            s.slots - limiter.slots.available_permits()
        };
        limiter.observe(took, first_byte, bytes, throttled, busy);
        self.release();
    }

    fn release(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let mut s = self.limiter.state();
        if s.retire > 0 {
            s.retire -= 1;
            s.slots -= 1;
            permit.forget();
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rounds` round trips of GETs that each take `took`, with the limit kept busy (each
    /// finished GET replaced by a new one while a slot is free), as under a large batch.
    fn rounds(l: &Arc<Limiter>, rounds: usize, took: Duration) {
        let mut held: Vec<Slot> = Vec::new();
        for _ in 0..rounds {
            while let Ok(p) = Arc::clone(&l.slots).try_acquire_owned() {
                held.push(Slot {
                    permit: Some(p),
                    limiter: Arc::clone(l),
                });
            }
            for slot in std::mem::take(&mut held) {
                slot.finish(Some(took), None, 0, 0);
                if let Ok(p) = Arc::clone(&l.slots).try_acquire_owned() {
                    held.push(Slot {
                        permit: Some(p),
                        limiter: Arc::clone(l),
                    });
                }
            }
        }
    }

    #[test]
    fn the_limit_doubles_per_round_trip_while_gets_stay_quick_up_to_max() {
        let l = Limiter::new(64, 16, 512, true);
        rounds(&l, 1, Duration::from_millis(80));
        assert!((120..=130).contains(&l.limit()), "limit {}", l.limit());
        rounds(&l, 3, Duration::from_millis(80));
        assert_eq!(l.limit(), 512);
        assert_eq!(l.slots.available_permits(), 512);
    }

    #[test]
    fn the_limit_falls_when_gets_slow_down_and_on_throttling() {
        let l = Limiter::new(256, 16, 512, true);
        rounds(&l, 2, Duration::from_millis(20));
        let quick = l.limit();
        assert_eq!(quick, 512);
        // Five times slower (a saturated link): a quarter less per round trip.
        rounds(&l, 1, Duration::from_millis(100));
        let slow = l.limit();
        assert!(
            (quick * 3 / 4 - 40..quick * 3 / 4 + 40).contains(&slow),
            "{quick} -> {slow}"
        );
        assert_eq!(l.slots.available_permits(), slow);
        // Slow for two windows of GETs: that is the new quickest, and the limit grows again.
        rounds(&l, 30, Duration::from_millis(100));
        assert_eq!(l.limit(), 512);
        // A 503: 30% less at once.
        let l = Limiter::new(200, 16, 512, true);
        l.slots.try_acquire().unwrap().forget();
        let slot = Slot {
            permit: None,
            limiter: Arc::clone(&l),
        };
        slot.finish(None, None, 0, 1);
        assert_eq!(l.limit(), 140);
    }

    #[test]
    fn held_slots_are_retired_as_they_come_back() {
        let l = Limiter::new(100, 10, 100, true);
        let mut held: Vec<Slot> = (0..100)
            .map(|_| Slot {
                permit: Some(Arc::clone(&l.slots).try_acquire_owned().unwrap()),
                limiter: Arc::clone(&l),
            })
            .collect();
        // A throttling answer while every slot is held: the cut waits for them.
        held.pop().unwrap().finish(None, None, 0, 1);
        assert_eq!(l.limit(), 70);
        drop(held);
        assert_eq!(l.slots.available_permits(), 70);
    }

    #[test]
    fn holes_merge_while_smaller_than_the_bandwidth_delay_product_per_slot() {
        let l = Limiter::new(100, 10, 100, false);
        assert_eq!(l.max_gap(1 << 20), 1 << 20, "nothing measured yet");
        // 100 busy slots, GETs of 80 ms bringing 1 MB each, one finishing (and replaced) every
        // 0.8 ms: 1.25 GB/s.
        let take = || Slot {
            permit: Some(Arc::clone(&l.slots).try_acquire_owned().unwrap()),
            limiter: Arc::clone(&l),
        };
        let mut held: std::collections::VecDeque<Slot> = (0..100).map(|_| take()).collect();
        let start = Instant::now();
        while start.elapsed() < METER_WINDOW * 2 {
            std::thread::sleep(Duration::from_micros(800));
            held.pop_front().unwrap().finish(
                Some(Duration::from_millis(80)),
                Some(Duration::from_millis(20)),
                1_000_000,
                0,
            );
            held.push_back(take());
        }
        let bw = l.state().bandwidth.unwrap();
        assert!((0.8e9..1.3e9).contains(&bw), "{bw}");
        // Fixed limits measure too, and are at their ceiling. First bytes after 20 ms:
        // 1.25e9 * 0.02 / 100 = 250 kB.
        let gap = l.max_gap(u64::MAX);
        assert!((170_000..280_000).contains(&gap), "{gap}");
        assert_eq!(l.max_gap(4096), 4096);
        // Where round trips cost nothing, a GET's own cost keeps holes merging.
        l.state().first_byte_previous = 0.0;
        let gap = l.max_gap(u64::MAX);
        let floor = 1.25e9 * GET_COST.as_secs_f64();
        assert!(
            ((floor * 0.7) as u64..(floor * 1.1) as u64).contains(&gap),
            "{gap}"
        );
    }

    /// GETs of a few bytes from a slow store deliver little and measure a slow link: holes
    /// the size of a GET's own headers still merge.
    #[test]
    fn small_holes_merge_however_slowly_small_gets_arrive() {
        let l = Limiter::new(8, 1, 8, false);
        let start = Instant::now();
        while start.elapsed() < METER_WINDOW * 2 {
            let slot = Slot {
                permit: Some(Arc::clone(&l.slots).try_acquire_owned().unwrap()),
                limiter: Arc::clone(&l),
            };
            std::thread::sleep(Duration::from_millis(5));
            slot.finish(
                Some(Duration::from_millis(5)),
                Some(Duration::from_micros(4900)),
                64,
                0,
            );
        }
        let bw = l.state().bandwidth.unwrap();
        assert!(bw < 20_000.0, "{bw}");
        assert_eq!(l.max_gap(1 << 20), MIN_GAP);
        assert_eq!(l.max_gap(100), 100);
    }

    #[test]
    fn gets_are_hedged_past_the_95th_percentile_and_well_past_the_median() {
        let l = Limiter::new(64, 16, 512, true);
        let finish = |ms: f64| {
            let slot = Slot {
                permit: Some(Arc::clone(&l.slots).try_acquire_owned().unwrap()),
                limiter: Arc::clone(&l),
            };
            let t = Duration::from_secs_f64(ms / 1e3);
            slot.finish(Some(t), Some(t), 1000, 0);
        };
        for _ in 0..63 {
            finish(20.0);
        }
        assert_eq!(l.hedge_delay(), None, "too few GETs timed");
        // 90% at 20 ms, 10% at 200 ms: the 95th percentile is 200 ms.
        for i in 0..257 {
            finish(if i % 10 == 0 { 200.0 } else { 20.0 });
        }
        let d = l.hedge_delay().unwrap().as_secs_f64() * 1e3;
        assert!((199.0..201.0).contains(&d), "{d}");
        // All about 20 ms: no duplicates before 1.5 times the median.
        for i in 0..256 {
            finish(20.0 + f64::from(i % 3));
        }
        let d = l.hedge_delay().unwrap().as_secs_f64() * 1e3;
        assert!((31.0..32.0).contains(&d), "{d}");
    }

    #[test]
    fn a_fixed_limit_never_moves() {
        let l = Limiter::new(8, 4, 64, false);
        rounds(&l, 5, Duration::from_millis(1));
        assert_eq!(l.limit(), 64);
        Slot {
            permit: None,
            limiter: Arc::clone(&l),
        }
        .finish(None, None, 0, 5);
        assert_eq!(l.limit(), 64);
    }
}
