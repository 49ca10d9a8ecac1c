//! What the simulator counts: requests, bytes, and how many connections and requests were
//! open at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

/// A snapshot of the counters since the last reset.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Requests for objects (GET and HEAD; the control endpoints are not counted).
    pub requests: u64,
    /// GET requests among them.
    pub gets: u64,
    /// HEAD requests among them.
    pub heads: u64,
    /// Body bytes sent.
    pub bytes_sent: u64,
    /// Responses with a 4xx or 5xx status, injected faults included.
    pub errors: u64,
    /// Faults injected.
    pub faults: u64,
    /// Connections accepted.
    pub connections: u64,
    /// Connections open now.
    pub open_connections: u64,
    /// The most connections open at once.
    pub max_open_connections: u64,
    /// Requests being answered now (from arrival to the body's last byte).
    pub in_flight: u64,
    /// The most requests being answered at once.
    pub max_in_flight: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) gets: AtomicU64,
    pub(crate) heads: AtomicU64,
    pub(crate) bytes_sent: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) faults: AtomicU64,
    pub(crate) connections: AtomicU64,
    open_connections: AtomicU64,
    max_open_connections: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
}

/// Holds one unit of a gauge (an open connection, a request in flight) until dropped.
pub(crate) struct Gauge {
    counters: Arc<Counters>,
    connection: bool,
}

impl Gauge {
    fn enter(counters: &Arc<Counters>, connection: bool) -> Gauge {
        let (now, max) = counters.gauge(connection);
        max.fetch_max(now.fetch_add(1, Relaxed) + 1, Relaxed);
        Gauge {
            counters: Arc::clone(counters),
            connection,
        }
    }

    /// An accepted connection, open until dropped.
    pub(crate) fn connection(counters: &Arc<Counters>) -> Gauge {
        counters.connections.fetch_add(1, Relaxed);
        Self::enter(counters, true)
    }

    /// A request, in flight until dropped.
    pub(crate) fn request(counters: &Arc<Counters>) -> Gauge {
        Self::enter(counters, false)
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        self.counters.gauge(self.connection).0.fetch_sub(1, Relaxed);
    }
}

impl Counters {
    /// The (current, maximum) pair of the connection or the request gauge.
    fn gauge(&self, connection: bool) -> (&AtomicU64, &AtomicU64) {
        if connection {
            (&self.open_connections, &self.max_open_connections)
        } else {
            (&self.in_flight, &self.max_in_flight)
        }
    }

    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            requests: self.requests.load(Relaxed),
            gets: self.gets.load(Relaxed),
            heads: self.heads.load(Relaxed),
            bytes_sent: self.bytes_sent.load(Relaxed),
            errors: self.errors.load(Relaxed),
            faults: self.faults.load(Relaxed),
            connections: self.connections.load(Relaxed),
            open_connections: self.open_connections.load(Relaxed),
            max_open_connections: self.max_open_connections.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            max_in_flight: self.max_in_flight.load(Relaxed),
        }
    }

    /// Zeroes the counts; the maxima restart from what is open now.
    pub(crate) fn reset(&self) {
        for c in [
            &self.requests,
            &self.gets,
            &self.heads,
            &self.bytes_sent,
            &self.errors,
            &self.faults,
            &self.connections,
        ] {
            c.store(0, Relaxed);
        }
        self.max_open_connections
            .store(self.open_connections.load(Relaxed), Relaxed);
        self.max_in_flight
            .store(self.in_flight.load(Relaxed), Relaxed);
    }
}
