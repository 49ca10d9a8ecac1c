//! What the simulator does to each response: a first-byte latency (fixed, plus uniform jitter,
//! plus a heavy tail), and bandwidth caps per connection and for the whole server.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How responses are shaped. All zero (the default) is an unshaped server.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Shaping {
    /// Fixed part of the delay before a response's first byte, in milliseconds.
    pub latency_ms: f64,
    /// Uniform jitter added to the fixed part: a draw from `[0, jitter_ms)`.
    pub jitter_ms: f64,
    /// The share of requests (0 to 1) whose first-byte delay is `tail_factor` times longer.
    pub tail_fraction: f64,
    /// How much longer a tail request waits (10 = ten times the drawn delay).
    pub tail_factor: f64,
    /// Bytes per second one connection's bodies may use; 0 for no cap.
    pub conn_bytes_per_s: f64,
    /// Bytes per second all bodies together may use; 0 for no cap.
    pub total_bytes_per_s: f64,
    /// Seed of the latency draws (request `n` of a run draws from `(seed, n)`).
    pub seed: u64,
}

impl Shaping {
    /// Checks that every field is finite and in range.
    pub fn validate(&self) -> Result<(), String> {
        let fields = [
            ("latency_ms", self.latency_ms),
            ("jitter_ms", self.jitter_ms),
            ("tail_fraction", self.tail_fraction),
            ("tail_factor", self.tail_factor),
            ("conn_bytes_per_s", self.conn_bytes_per_s),
            ("total_bytes_per_s", self.total_bytes_per_s),
        ];
        for (name, v) in fields {
            if !v.is_finite() || v < 0.0 {
                return Err(format!("{name} must be finite and >= 0, got {v}"));
            }
        }
        if self.tail_fraction > 1.0 {
            return Err(format!(
                "tail_fraction must be at most 1, got {}",
                self.tail_fraction
            ));
        }
        Ok(())
    }

    /// The first-byte delay of request number `n`.
    pub fn first_byte_delay(&self, n: u64) -> Duration {
        let r = splitmix64(self.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let (u, v) = (unit(r), unit(splitmix64(r)));
        let mut ms = self.latency_ms + self.jitter_ms * u;
        if v < self.tail_fraction && self.tail_factor > 0.0 {
            ms *= self.tail_factor;
        }
        Duration::from_secs_f64(ms / 1e3)
    }
}

/// A pacer for one bandwidth cap: a virtual clock of when the link is next free. Reserving
/// `n` bytes moves it by `n / rate`. A link idle for less than [`Pacer::IDLE`] keeps its
/// schedule, so a sender that wakes late from a timer does not lose bandwidth; idle longer, it
/// starts again from now, so a burst is at most `IDLE` worth of bytes.
#[derive(Debug)]
pub struct Pacer {
    rate: f64,
    next: Instant,
}

impl Pacer {
    /// How long a link may idle and keep its schedule.
    pub const IDLE: Duration = Duration::from_millis(5);

    /// A pacer of `bytes_per_s` (0 for no cap).
    pub fn new(bytes_per_s: f64) -> Self {
        Self {
            rate: bytes_per_s,
            next: Instant::now(),
        }
    }

    /// Changes the cap; the reservations made stand.
    pub fn set_rate(&mut self, bytes_per_s: f64) {
        self.rate = bytes_per_s;
    }

    /// Reserves `n` bytes of the link at `now`: returns when the last of them has left, or
    /// `None` without a cap.
    pub fn reserve(&mut self, n: usize, now: Instant) -> Option<Instant> {
        if self.rate <= 0.0 {
            return None;
        }
        let start = if now > self.next + Self::IDLE {
            now
        } else {
            self.next
        };
        self.next = start + Duration::from_secs_f64(n as f64 / self.rate);
        Some(self.next)
    }
}

/// The size of the pieces a capped body is sent in: about 2 ms of the tighter cap, so the
/// timer's millisecond resolution does not slow the link, within 16 KiB to 1 MiB.
pub(crate) fn piece_size(conn_bytes_per_s: f64, total_bytes_per_s: f64) -> usize {
    let rate = [conn_bytes_per_s, total_bytes_per_s]
        .into_iter()
        .filter(|r| *r > 0.0)
        .fold(f64::INFINITY, f64::min);
    if rate.is_infinite() {
        return usize::MAX;
    }
    ((rate * 0.002) as usize).clamp(16 << 10, 1 << 20)
}

/// One step of the splitmix64 generator: a well-mixed 64-bit value of `x`.
pub(crate) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform draw from `[0, 1)` made of the top 53 bits of `r`.
fn unit(r: u64) -> f64 {
    (r >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_in_the_configured_band_and_the_tail_has_its_share() {
        let s = Shaping {
            latency_ms: 20.0,
            jitter_ms: 4.0,
            tail_fraction: 0.01,
            tail_factor: 10.0,
            seed: 7,
            ..Shaping::default()
        };
        let n = 100_000;
        let mut tail = 0;
        let mut sum = 0.0;
        for i in 0..n {
            let ms = s.first_byte_delay(i).as_secs_f64() * 1e3;
            if ms >= 200.0 {
                assert!(ms < 240.0, "{ms}");
                tail += 1;
            } else {
                assert!((20.0..24.0).contains(&ms), "{ms}");
                sum += ms;
            }
        }
        let share = f64::from(tail) / n as f64;
        assert!((0.008..0.012).contains(&share), "tail share {share}");
        let mean = sum / f64::from(n as u32 - tail);
        assert!((21.9..22.1).contains(&mean), "mean {mean}");
    }

    #[test]
    fn a_pacer_spaces_reservations_by_the_rate_and_keeps_no_credit() {
        let mut p = Pacer::new(1e6);
        let t0 = Instant::now();
        let ms = |t: Option<Instant>, from: Instant| (t.unwrap() - from).as_secs_f64() * 1e3;
        assert!((ms(p.reserve(1000, t0), t0) - 1.0).abs() < 1e-3);
        assert!((ms(p.reserve(1000, t0), t0) - 2.0).abs() < 1e-3);
        // Woken a little late: the schedule stands.
        let late = t0 + Duration::from_millis(3);
        assert!((ms(p.reserve(1000, late), t0) - 3.0).abs() < 1e-3);
        // Idle for a second: the next reservation starts from now, not from the past.
        let later = t0 + Duration::from_secs(1);
        assert!((ms(p.reserve(1000, later), later) - 1.0).abs() < 1e-3);
        assert_eq!(Pacer::new(0.0).reserve(1000, t0), None);
    }

    #[test]
    fn bad_shaping_is_refused_by_name() {
        let s = Shaping {
            jitter_ms: -1.0,
            ..Shaping::default()
        };
        assert!(s.validate().unwrap_err().contains("jitter_ms"));
        let s = Shaping {
            tail_fraction: 2.0,
            ..Shaping::default()
        };
        assert!(s.validate().unwrap_err().contains("tail_fraction"));
        let s = Shaping {
            latency_ms: f64::NAN,
            ..Shaping::default()
        };
        assert!(s.validate().is_err());
    }
}
