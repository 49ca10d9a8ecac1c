//! Faults the simulator can inject into the responses to matching requests, for tests of a
//! client's retries and errors.

use serde::{Deserialize, Serialize};

/// What goes wrong with a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// `503 Slow Down` with S3's `SlowDown` error body.
    SlowDown,
    /// `500 Internal Error` with S3's `InternalError` error body.
    InternalError,
    /// The connection is closed before any response.
    Reset,
    /// Headers and the first half of the body, then nothing (the connection stays open) for
    /// ten minutes.
    Stall,
    /// Headers promising the whole body, half of it, then the connection closes.
    Short,
    /// A well-formed `206` whose `Content-Range` and body cover only the first half of the
    /// range asked for (a server that answers with fewer bytes than asked).
    Truncate,
    /// `403 Forbidden` with S3's `AccessDenied` error body.
    AccessDenied,
    /// `403 Forbidden` with S3's `ExpiredToken` error body.
    ExpiredToken,
}

/// A fault rule: the next `count` requests whose key contains `key_contains` (every request
/// with an empty pattern) get `kind`; a `count` of 0 means every matching request, until the
/// rules are cleared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// What goes wrong.
    pub kind: FaultKind,
    /// How many matching requests it hits; 0 for all of them.
    #[serde(default)]
    pub count: u64,
    /// A substring of the request's path (`/bucket/key`) that selects the requests.
    #[serde(default)]
    pub key_contains: String,
}

/// The armed rules, first match wins.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    rules: Vec<(Fault, u64)>,
}

impl Faults {
    pub(crate) fn add(&mut self, fault: Fault) {
        self.rules.push((fault, 0));
    }

    pub(crate) fn clear(&mut self) {
        self.rules.clear();
    }

    /// The fault for a request of `path`, if a rule matches and has hits left.
    pub(crate) fn take(&mut self, path: &str) -> Option<FaultKind> {
        let (fault, used) = self.rules.iter_mut().find(|(f, used)| {
            path.contains(&f.key_contains) && (f.count == 0 || *used < f.count)
        })?;
        *used += 1;
        Some(fault.kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_hit_their_count_of_matching_requests_then_stop() {
        let mut f = Faults::default();
        f.add(Fault {
            kind: FaultKind::SlowDown,
            count: 2,
            key_contains: "c/0".into(),
        });
        f.add(Fault {
            kind: FaultKind::Reset,
            count: 0,
            key_contains: "zarr.json".into(),
        });
        assert_eq!(f.take("/b/a.zarr/c/1"), None);
        assert_eq!(f.take("/b/a.zarr/c/0"), Some(FaultKind::SlowDown));
        assert_eq!(f.take("/b/a.zarr/c/0"), Some(FaultKind::SlowDown));
        assert_eq!(f.take("/b/a.zarr/c/0"), None);
        for _ in 0..5 {
            assert_eq!(f.take("/b/a.zarr/zarr.json"), Some(FaultKind::Reset));
        }
        f.clear();
        assert_eq!(f.take("/b/a.zarr/zarr.json"), None);
    }
}
