//! A bounded least-recently-used cache with a byte budget, used for shard indexes and the
//! optional decoded-chunk cache.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

use parking_lot::Mutex;

/// A thread-safe LRU map whose entries each cost some bytes; the total stays within `budget`.
#[derive(Debug)]
pub(crate) struct LruCache<K, V> {
    budget: usize,
    inner: Mutex<Inner<K, V>>,
}

#[derive(Debug)]
struct Inner<K, V> {
    map: HashMap<K, Entry<V>>,
    used: usize,
    tick: u64,
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    cost: usize,
    last_used: u64,
}

impl<K: Hash + Eq + Clone, V: Clone> LruCache<K, V> {
    /// An empty cache holding at most `budget` bytes.
    pub(crate) fn new(budget: usize) -> Self {
        LruCache {
            budget,
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                used: 0,
                tick: 0,
            }),
        }
    }

    /// The value for `key`, marking it recently used.
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut inner = self.inner.lock();
        inner.tick += 1;
        let tick = inner.tick;
        inner.map.get_mut(key).map(|e| {
            e.last_used = tick;
            e.value.clone()
        })
    }

    /// Stores `value` (costing `cost` bytes). Entries larger than the whole budget are not kept.
    /// When full, evicts the least recently used eighth of the entries at once, so inserts stay
    /// cheap on average.
    pub(crate) fn insert(&self, key: K, value: V, cost: usize) {
        if cost > self.budget {
            return;
        }
        let mut inner = self.inner.lock();
        inner.tick += 1;
        let tick = inner.tick;
        if let Some(old) = inner.map.insert(
            key,
            Entry {
                value,
                cost,
                last_used: tick,
            },
        ) {
            inner.used -= old.cost;
        }
        inner.used += cost;
        if inner.used > self.budget {
            let mut ages: Vec<(u64, K)> = inner
                .map
                .iter()
                .map(|(k, e)| (e.last_used, k.clone()))
                .collect();
            ages.sort_unstable_by_key(|(t, _)| *t);
            let target = self.budget - self.budget / 8;
            for (_, k) in ages {
                if inner.used <= target {
                    break;
                }
                if let Some(e) = inner.map.remove(&k) {
                    inner.used -= e.cost;
                }
            }
        }
    }

    /// Bytes held now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.inner.lock().used
    }

    /// Forgets every entry.
    pub(crate) fn clear(&self) {
        let mut inner = self.inner.lock();
        inner.map.clear();
        inner.used = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_within_budget() {
        let c = LruCache::new(100);
        for i in 0..10u32 {
            c.insert(i, i, 10);
        }
        assert_eq!(c.used(), 100);
        assert_eq!(c.get(&0), Some(0)); // 0 becomes the most recent
        c.insert(10, 10, 10); // over budget: evict down to 87
        assert!(c.used() <= 100);
        assert_eq!(c.get(&0), Some(0), "recently used entries survive");
        assert_eq!(c.get(&1), None, "the oldest went first");
        c.insert(99, 99, 1000);
        assert_eq!(c.get(&99), None, "bigger than the budget: not kept");
        c.clear();
        assert_eq!(c.used(), 0);
    }
}
