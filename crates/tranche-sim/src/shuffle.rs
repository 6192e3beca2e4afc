//! The order a batch runs its lines in: a keyed permutation of `0..n` computed one position at a
//! time (a small Feistel network with cycle walking), so that no batch keeps its run order, or any
//! other per-line list, in memory.
//!
//! The network permutes the `2k`-bit numbers (`4^k >= n`); positions that land outside `0..n` are
//! fed through it again until they land inside ("cycle walking"), which keeps it a bijection of
//! `0..n`. The expected number of passes is below 4.

/// Rounds of the Feistel network.
const ROUNDS: usize = 4;

/// A seeded permutation of `0..n` that is never the identity when `n >= 2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Order {
    n: u64,
    /// Bits of each half of the network's domain: `2^(2 * half_bits) >= n`.
    half_bits: u32,
    keys: [u64; ROUNDS],
    /// Added to a position (mod `n`) before it is permuted: 1 only in the rare case that the
    /// keyed permutation is the identity, which the shift turns into a rotation.
    shift: u64,
}

/// A 64-bit mixing function (the finalizer of SplitMix64) keyed by `key`.
fn mix(key: u64, x: u64) -> u64 {
    let mut z = (x ^ key).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Order {
    /// The permutation of `0..n` keyed by the 32 bytes of `key`.
    pub(crate) fn new(n: u64, key: [u8; 32]) -> Self {
        let mut keys = [0u64; ROUNDS];
        for (k, chunk) in keys.iter_mut().zip(key.chunks_exact(8)) {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            *k = u64::from_le_bytes(word);
        }
        // Bits needed to number 0..n, split into two halves of at least one bit each.
        let bits = if n <= 1 { 0 } else { 64 - (n - 1).leading_zeros() };
        let half_bits = bits.div_ceil(2).max(1);
        let mut order = Self { n, half_bits, keys, shift: 0 };
        if n >= 2 && (0..n).all(|i| order.walk(i) == i) {
            order.shift = 1;
        }
        order
    }

    /// How many positions the permutation has.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        self.n
    }

    /// The line (input index) that runs at position `k` (`k < n`).
    pub(crate) fn at(&self, k: u64) -> u64 {
        if self.n <= 1 {
            return 0;
        }
        self.walk(k.saturating_add(self.shift) % self.n)
    }

    /// One pass of the Feistel network over the `2 * half_bits`-bit numbers.
    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for key in self.keys {
            let next = left ^ (mix(key, right) & mask);
            left = right;
            right = next;
        }
        (left << self.half_bits) | right
    }

    /// Cycle walking: passes through the network until the value is back inside `0..n`. It always
    /// gets there, since `x` itself is on its own cycle.
    fn walk(&self, x: u64) -> u64 {
        let mut y = self.feistel(x);
        while y >= self.n {
            y = self.feistel(y);
        }
        y
    }
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;

    fn key(seed: u64) -> [u8; 32] {
        Sha256::digest(seed.to_le_bytes()).into()
    }

    fn positions(order: &Order) -> Vec<u64> {
        (0..order.len()).map(|k| order.at(k)).collect()
    }

    #[test]
    fn is_a_bijection_for_many_sizes() {
        for n in [1u64, 2, 3, 4, 5, 7, 8, 9, 17, 255, 256, 257, 1000, 4097, 50_000, 100_000] {
            for seed in 0..3 {
                let order = Order::new(n, key(seed));
                let mut seen = vec![false; usize::try_from(n).unwrap()];
                for k in 0..n {
                    let i = usize::try_from(order.at(k)).unwrap();
                    assert!(!seen[i], "n={n} seed={seed}: {i} twice");
                    seen[i] = true;
                }
                assert!(seen.iter().all(|s| *s), "n={n} seed={seed}");
            }
        }
    }

    #[test]
    fn order_is_a_permutation_and_never_identity() {
        for n in 2..40u64 {
            for seed in 0..20 {
                let order = positions(&Order::new(n, key(seed)));
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>());
                assert!(order.windows(2).any(|w| w[0] > w[1]), "n={n} seed={seed}");
            }
        }
        assert_eq!(positions(&Order::new(1, key(3))), vec![0]);
        assert_eq!(positions(&Order::new(9, key(3))), positions(&Order::new(9, key(3))));
        assert_ne!(positions(&Order::new(50, key(3))), positions(&Order::new(50, key(4))));
    }

    #[test]
    fn an_identity_key_is_turned_into_a_rotation() {
        // Find a key whose network fixes both of 0..2, then check the order still moves them.
        let identity = (0..200)
            .map(|seed| Order { shift: 0, ..Order::new(2, key(seed)) })
            .find(|o| o.walk(0) == 0 && o.walk(1) == 1)
            .unwrap();
        let fixed = Order::new(2, {
            let mut bytes = [0u8; 32];
            for (chunk, k) in bytes.chunks_exact_mut(8).zip(identity.keys) {
                chunk.copy_from_slice(&k.to_le_bytes());
            }
            bytes
        });
        assert_eq!(fixed.shift, 1);
        assert_eq!(positions(&fixed), vec![1, 0]);
    }

    #[test]
    fn large_orders_look_shuffled() {
        let order = positions(&Order::new(50_000, key(7)));
        let rising = order.windows(2).filter(|w| w[0] < w[1]).count();
        assert!((20_000..30_000).contains(&rising), "{rising} rising pairs");
        let fixed = order.iter().enumerate().filter(|(k, i)| *k as u64 == **i).count();
        assert!(fixed < 20, "{fixed} fixed points");
    }
}
