//! Token buckets by key, for the server's rate limits: stores per task and per token, and
//! failed console logins per source.
//!
//! Each key's bucket holds up to `per_minute` units and refills continuously at that rate.
//! Keys whose bucket has refilled are dropped once the map grows, so memory stays bounded
//! by the keys used in the last minute, however many keys a caller makes up.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Instant;

use parking_lot::Mutex;

/// Past this many keys, refilled buckets are dropped at the next take.
const PRUNE_AT: usize = 4096;

/// Buckets of `per_minute` units per key.
#[derive(Debug)]
pub struct Buckets<K> {
    per_minute: f64,
    map: Mutex<HashMap<K, (f64, Instant)>>,
}

impl<K: Hash + Eq + Clone> Buckets<K> {
    /// Full buckets of `per_minute` (at least 1) units.
    pub fn new(per_minute: u64) -> Buckets<K> {
        Buckets {
            per_minute: per_minute.max(1) as f64,
            map: Mutex::default(),
        }
    }

    /// Takes one unit from `key`'s bucket. `Err` carries the seconds until one is back;
    /// nothing is taken then.
    pub fn take(&self, key: &K) -> Result<(), u64> {
        self.spend(key, true)
    }

    /// Whether `key`'s bucket has a unit left, taking none. `Err` as for [`Buckets::take`].
    pub fn check(&self, key: &K) -> Result<(), u64> {
        self.spend(key, false)
    }

    fn spend(&self, key: &K, take: bool) -> Result<(), u64> {
        let now = Instant::now();
        let rate = self.per_minute;
        let refilled = |(left, at): (f64, Instant)| {
            (left + now.duration_since(at).as_secs_f64() * rate / 60.0).min(rate)
        };
        let mut map = self.map.lock();
        if map.len() >= PRUNE_AT && !map.contains_key(key) {
            map.retain(|_, b| refilled(*b) < rate);
        }
        let left = map.get(key).map_or(rate, |b| refilled(*b));
        if left < 1.0 {
            map.insert(key.clone(), (left, now));
            return Err(((1.0 - left) * 60.0 / rate).ceil().max(1.0) as u64);
        }
        if take {
            map.insert(key.clone(), (left - 1.0, now));
        }
        Ok(())
    }

    /// How many keys are held now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_empties_per_key_and_says_when_to_come_back() {
        let b = Buckets::new(3);
        for _ in 0..3 {
            assert_eq!(b.take(&"a"), Ok(()));
        }
        assert!(b.check(&"a").is_err());
        assert_eq!(b.take(&"a"), Err(20));
        // Another key has its own bucket; a check takes nothing.
        assert_eq!(b.check(&"b"), Ok(()));
        assert_eq!(b.check(&"b"), Ok(()));
        assert_eq!(b.take(&"b"), Ok(()));
    }

    #[test]
    fn refilled_buckets_are_dropped_when_the_map_grows() {
        let b = Buckets::new(1_000_000);
        for i in 0..PRUNE_AT {
            b.take(&i).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
        b.take(&usize::MAX).unwrap();
        assert!(b.len() < 10, "{}", b.len());
    }
}
