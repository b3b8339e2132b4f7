//! A seeded random source for the deterministic simulations (weir-runtime's of the control
//! plane, weir-deploy's of the deployment controller): SplitMix64, so every choice of a run
//! follows from its seed on every machine.

/// SplitMix64.
#[derive(Clone, Debug, Default)]
pub struct SeededRng(u64);

impl SeededRng {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> SeededRng {
        SeededRng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::SeededRng;

    #[test]
    fn a_seed_gives_the_same_stream() {
        let (mut a, mut b) = (SeededRng::new(7), SeededRng::new(7));
        let first: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        assert_eq!(first, (0..5).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(first[0], SeededRng::new(8).next_u64());
        assert!((0..100).all(|_| a.below(3) < 3));
    }
}
