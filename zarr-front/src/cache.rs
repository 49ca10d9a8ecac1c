//! The caches of shard indexes and decoded chunks: `quick_cache` with a byte budget.
//!
//! Each entry costs the bytes its caller says; the total stays within the budget the cache was
//! made with. Eviction is `quick_cache`'s CLOCK-Pro-like policy, which keeps entries that are
//! used again when a stream of one-off entries passes through (random crops revisiting part of
//! an array). One shard, so that an entry may use the whole budget (all but the 3% `quick_cache`
//! keeps for entries not yet used twice), not one shard's share of it.

use std::hash::Hash;

use quick_cache::sync::{Cache, DefaultLifecycle};
use quick_cache::{DefaultHashBuilder, Equivalent, OptionsBuilder, Weighter};

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
        let options = OptionsBuilder::new()
            .weight_capacity(budget as u64)
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

    /// Bytes held now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.inner.weight() as usize
    }

    /// Forgets every entry.
    pub(crate) fn clear(&self) {
        self.inner.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
