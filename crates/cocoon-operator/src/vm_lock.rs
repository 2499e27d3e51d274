//! The VM stripe lock: 64 async mutexes, one chosen by a per-process seeded hash of the VM
//! name, so that every pass touching the same VM (registry calls included) runs one at a time.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use tokio::sync::{Mutex, MutexGuard};

/// Number of stripes.
pub const STRIPES: usize = 64;

/// The stripe set.
pub struct Stripes {
    seed: RandomState,
    locks: Vec<Mutex<()>>,
}

impl Default for Stripes {
    fn default() -> Self {
        Stripes {
            seed: RandomState::new(),
            locks: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }
}

impl Stripes {
    /// Locks the stripe of `vm` until the guard is dropped.
    pub async fn lock(&self, vm: &str) -> MutexGuard<'_, ()> {
        let i = (self.seed.hash_one(vm) % STRIPES as u64) as usize;
        self.locks[i].lock().await
    }
}
