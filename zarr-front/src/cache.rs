//! The caches of shard indexes and decoded chunks: `quick_cache` with a byte budget, and the
//! memory of recently read chunks that decides which decoded chunks are worth keeping.
//!
//! Each entry costs the bytes its caller says; the total stays within the budget the cache was
//! made with. Eviction is `quick_cache`'s CLOCK-Pro-like policy, which keeps entries that are
//! used again when a stream of one-off entries passes through (random crops revisiting part of
//! an array). One shard, so that an entry may use the whole budget (all but the 3% `quick_cache`
//! keeps for entries not yet used again), not one shard's share of it.

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};

use quick_cache::sync::{Cache, DefaultLifecycle};
use quick_cache::{DefaultHashBuilder, Equivalent, OptionsBuilder, Weighter};

/// The share of the budget `quick_cache` keeps for entries used since they came in (its
/// default).
const DEFAULT_HOT_SHARE: f64 = 0.97;

/// Bytes of budget per entry expected (a shard index or a small chunk), which sizes the memory
/// of recently evicted keys that lets an entry used again come back as one worth keeping.
const EXPECTED_ENTRY_BYTES: usize = 16 << 10;

/// Weighs an entry by the cost stored beside its value.
#[derive(Debug, Clone, Copy)]
struct Cost;

impl<K, V> Weighter<K, (V, usize)> for Cost {
    fn weight(&self, _: &K, value: &(V, usize)) -> u64 {
        value.1 as u64
    }
}

/// A thread-safe map whose entries each cost some bytes; the total stays within `budget`.
pub(crate) struct LruCache<K, V> {
    budget: usize,
    inner: Cache<K, (V, usize), Cost>,
}

impl<K: Hash + Eq + Clone, V: Clone> std::fmt::Debug for LruCache<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LruCache")
            .field("budget", &self.budget)
            .field("used", &self.inner.weight())
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone, V: Clone> LruCache<K, V> {
    /// An empty cache holding at most `budget` bytes.
    pub(crate) fn new(budget: usize) -> Self {
        Self::with_hot_share(budget, DEFAULT_HOT_SHARE)
    }

    /// An empty cache holding at most `budget` bytes, for entries that were asked for again
    /// before they are inserted (see [`SeenRecently`]): half of the budget holds entries not
    /// yet used since they came in, instead of 3%, as they are no longer one-off entries
    /// that `quick_cache` must keep from pushing out the rest.
    pub(crate) fn admitted(budget: usize) -> Self {
        Self::with_hot_share(budget, 0.5)
    }

    fn with_hot_share(budget: usize, hot: f64) -> Self {
        let options = OptionsBuilder::new()
            .weight_capacity(budget as u64)
            .hot_allocation(hot)
            .estimated_items_capacity((budget / EXPECTED_ENTRY_BYTES).max(1))
            .shards(1)
            .build()
            .expect("every option is set");
        LruCache {
            budget,
            inner: Cache::with_options(
                options,
                Cost,
                DefaultHashBuilder::default(),
                DefaultLifecycle::default(),
            ),
        }
    }

    /// The value for `key`, marking it recently used.
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<V>
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        self.inner.get(key).map(|(value, _)| value)
    }

    /// Stores `value` (costing `cost` bytes), evicting others as needed. Entries larger than
    /// the budget are not kept (nor those within 3% of it).
    pub(crate) fn insert(&self, key: K, value: V, cost: usize) {
        if cost > self.budget {
            return;
        }
        // `quick_cache` never evicts an entry of weight 0.
        self.inner.insert(key, (value, cost.max(1)));
    }

    /// The byte budget.
    pub(crate) fn budget(&self) -> usize {
        self.budget
    }

    /// Keeps only the entries whose key `keep` accepts.
    pub(crate) fn retain(&self, keep: impl Fn(&K) -> bool) {
        self.inner.retain(|key, _| keep(key));
    }

    /// Bytes held now.
    pub(crate) fn used(&self) -> usize {
        self.inner.weight() as usize
    }

    /// Whether another `cost` bytes fit without evicting anything.
    pub(crate) fn has_room_for(&self, cost: usize) -> bool {
        self.used().saturating_add(cost) <= self.budget
    }

    /// Forgets every entry.
    pub(crate) fn clear(&self) {
        self.inner.clear();
    }
}

/// Remembers the keys of recently read chunks, a fingerprint per slot, so that a
/// chunk read again soon is known as such. A decoded-chunk cache keeps only those once it is
/// full: keeping a chunk means decoding it whole, and where reads rarely come back to a chunk
/// (an array many times the budget) that would cost every read a whole decode to serve few.
///
/// Lossy by design: a slot holds the latest key hashed to it, so a key is forgotten once
/// another takes its slot, and a fingerprint match of two keys (1 in 2^64) only keeps a chunk
/// that was not read before.
pub(crate) struct SeenRecently {
    slots: Box<[AtomicU64]>,
    /// SipHash with fixed keys: the same keys take the same slots in every run.
    hasher: BuildHasherDefault<DefaultHasher>,
}

impl SeenRecently {
    /// Room for about `keys` keys (rounded up to a power of two, at least 64).
    pub(crate) fn new(keys: usize) -> Self {
        let n = keys.clamp(64, 1 << 24).next_power_of_two();
        SeenRecently {
            slots: (0..n).map(|_| AtomicU64::new(0)).collect(),
            hasher: BuildHasherDefault::default(),
        }
    }

    /// Whether `key` was seen since its slot last changed hands; either way it is remembered
    /// now, until another key takes its slot.
    pub(crate) fn seen_again<Q: Hash + ?Sized>(&self, key: &Q) -> bool {
        let (slot, print) = self.slot(key);
        slot.swap(print, Ordering::Relaxed) == print
    }

    /// Whether `key` was seen since its slot last changed hands, without remembering it.
    pub(crate) fn seen<Q: Hash + ?Sized>(&self, key: &Q) -> bool {
        let (slot, print) = self.slot(key);
        slot.load(Ordering::Relaxed) == print
    }

    /// The slot of `key` and its fingerprint there (never 0, which marks an empty slot).
    fn slot<Q: Hash + ?Sized>(&self, key: &Q) -> (&AtomicU64, u64) {
        let print = self.hasher.hash_one(key).max(1);
        (
            &self.slots[(print as usize) & (self.slots.len() - 1)],
            print,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_seen_again_until_its_slot_is_taken() {
        let seen = SeenRecently::new(100);
        assert_eq!(seen.slots.len(), 128);
        let key = |i: u64| vec![i, 7, 3];
        assert!(!seen.seen(key(1).as_slice()), "not yet");
        assert!(!seen.seen_again(key(1).as_slice()), "first time");
        assert!(seen.seen(key(1).as_slice()), "seen, asked without counting");
        assert!(seen.seen_again(key(1).as_slice()), "again");
        assert!(
            seen.seen_again(&key(1)),
            "owned and borrowed keys hash alike"
        );
        // Far more keys than slots pass: the first is forgotten, and most of the last ones of
        // a slot's worth are still remembered.
        for i in 2..10_000 {
            seen.seen_again(key(i).as_slice());
        }
        assert!(!seen.seen_again(key(1).as_slice()), "forgotten");
        // Newest first: asking for a forgotten key takes its slot back from a newer one.
        let kept = (9_950..10_000)
            .rev()
            .filter(|&i| seen.seen_again(key(i).as_slice()))
            .count();
        assert!(kept >= 35, "{kept} of the last 50 keys remembered");
        assert_eq!(SeenRecently::new(0).slots.len(), 64);
    }

    #[test]
    fn stays_within_budget_and_keeps_what_is_used() {
        let c = LruCache::new(100);
        for i in 0..10u32 {
            c.insert(i, i, 10);
            assert!(c.used() <= 100);
        }
        // A stream of one-off entries, with entry 0 used between them: 0 stays.
        for i in 10..200u32 {
            assert_eq!(c.get(&0), Some(0), "entry 0 evicted at {i}");
            c.insert(i, i, 10);
            assert!(c.used() <= 100, "{} bytes", c.used());
        }
        assert!(
            (190..200).any(|i| c.get(&i) == Some(i)),
            "recent entries are kept"
        );
        assert!(
            (10..150u32).all(|i| c.get(&i).is_none()),
            "old one-off entries went"
        );
        c.insert(0, 7, 10);
        assert_eq!(c.get(&0), Some(7), "an insert replaces");
        c.insert(99, 99, 1000);
        assert_eq!(c.get(&99), None, "bigger than the budget: not kept");
        c.clear();
        assert_eq!(c.used(), 0);
        assert_eq!(c.get(&0), None);
    }

    #[test]
    fn looks_up_by_a_borrowed_key_and_holds_big_entries() {
        let c: LruCache<Vec<u64>, u8> = LruCache::new(1 << 20);
        c.insert(vec![1, 2, 3], 5, 900 << 10);
        assert_eq!(c.get([1u64, 2, 3].as_slice()), Some(5));
        assert_eq!(c.get([1u64, 2].as_slice()), None);
    }
}
