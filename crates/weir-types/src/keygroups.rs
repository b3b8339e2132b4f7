//! Key groups: the unit in which keyed state is routed, snapshotted and rescaled.
//!
//! The formulas are Flink's (`KeyGroupRangeAssignment`): a key's group is its stable hash,
//! made non-negative, modulo max parallelism; group `g` belongs to subtask
//! `g * parallelism / max_parallelism`; subtask `i` owns the contiguous range
//! `[ceil(i * maxP / p), ((i + 1) * maxP - 1) / p]`.

use serde::{Deserialize, Serialize};

use crate::key::Key;

/// The largest max parallelism (and so parallelism) a job may have, as in Flink.
pub const MAX_PARALLELISM_UPPER_BOUND: u32 = 1 << 15;
/// The smallest default max parallelism, as in Flink.
pub const DEFAULT_MAX_PARALLELISM_LOWER_BOUND: u32 = 1 << 7;

/// Murmur3 x86_32 with seed 0 over `data`, including the final avalanche.
pub fn murmur3_32(data: &[u8]) -> u32 {
    let mut hasher = Murmur3::default();
    hasher.write(data);
    hasher.finish()
}

const MURMUR_C1: u32 = 0xcc9e_2d51;
const MURMUR_C2: u32 = 0x1b87_3593;

/// Streaming murmur3 x86_32 (seed 0): bytes may arrive in any pieces; the result equals
/// [`murmur3_32`] over their concatenation. Lets keys be hashed straight from their
/// serializer without an intermediate buffer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Murmur3 {
    h: u32,
    tail: u32,
    tail_len: u32,
    total_len: u32,
}

impl Murmur3 {
    #[inline]
    fn mix_block(&mut self, block: u32) {
        let k = block.wrapping_mul(MURMUR_C1).rotate_left(15).wrapping_mul(MURMUR_C2);
        self.h ^= k;
        self.h = self.h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }

    /// Feeds one byte.
    #[inline]
    pub fn write_byte(&mut self, byte: u8) {
        self.tail |= u32::from(byte) << (8 * self.tail_len);
        self.tail_len += 1;
        // Lengths above u32::MAX wrap, as the reference implementation's 32-bit length does.
        self.total_len = self.total_len.wrapping_add(1);
        if self.tail_len == 4 {
            let block = self.tail;
            self.mix_block(block);
            self.tail = 0;
            self.tail_len = 0;
        }
    }

    /// Feeds bytes.
    #[inline]
    pub fn write(&mut self, data: &[u8]) {
        let mut rest = data;
        while self.tail_len != 0 {
            let Some((first, tail)) = rest.split_first() else {
                return;
            };
            self.write_byte(*first);
            rest = tail;
        }
        let mut blocks = rest.chunks_exact(4);
        for block in &mut blocks {
            self.mix_block(u32::from_le_bytes([block[0], block[1], block[2], block[3]]));
        }
        self.total_len = self.total_len.wrapping_add((rest.len() - blocks.remainder().len()) as u32);
        for byte in blocks.remainder() {
            self.write_byte(*byte);
        }
    }

    /// The hash of everything fed so far.
    #[inline]
    pub fn finish(&self) -> u32 {
        let mut h = self.h;
        if self.tail_len != 0 {
            let k = self.tail.wrapping_mul(MURMUR_C1).rotate_left(15).wrapping_mul(MURMUR_C2);
            h ^= k;
        }
        h ^= self.total_len;
        fmix32(h)
    }
}

fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// Flink's rule for making a murmur result non-negative: negate negatives, MIN_VALUE -> 0.
fn non_negative(hash: u32) -> u32 {
    let signed = hash as i32;
    if signed >= 0 {
        signed as u32
    } else if signed != i32::MIN {
        signed.wrapping_neg() as u32
    } else {
        0
    }
}

/// The key group of a key's stable hash.
#[inline]
pub fn key_group_for_hash(stable_hash: u32, max_parallelism: u32) -> u32 {
    non_negative(stable_hash) % max_parallelism
}

/// The key group of `key` under `max_parallelism`.
#[inline]
pub fn assign_to_key_group<K: Key>(key: &K, max_parallelism: u32) -> u32 {
    key_group_for_hash(key.stable_hash(), max_parallelism)
}

/// The subtask (operator index) that owns `key_group`.
#[inline]
pub fn compute_operator_index_for_key_group(max_parallelism: u32, parallelism: u32, key_group: u32) -> u32 {
    // u64 keeps the product exact for every max parallelism up to 2^15.
    (u64::from(key_group) * u64::from(parallelism) / u64::from(max_parallelism)) as u32
}

/// Flink's default max parallelism: `parallelism * 1.5` rounded up to a power of two,
/// clamped to `[128, 32768]`.
pub fn compute_default_max_parallelism(parallelism: u32) -> u32 {
    let wanted = u64::from(parallelism) + u64::from(parallelism / 2);
    let rounded = wanted.max(1).next_power_of_two();
    rounded.clamp(u64::from(DEFAULT_MAX_PARALLELISM_LOWER_BOUND), u64::from(MAX_PARALLELISM_UPPER_BOUND)) as u32
}

/// A contiguous, inclusive range of key groups owned by one subtask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyGroupRange {
    /// First key group in the range.
    pub start: u32,
    /// Last key group in the range (inclusive); `end < start` means empty.
    pub end: u32,
}

impl KeyGroupRange {
    /// The range `[start, end]`.
    pub fn new(start: u32, end: u32) -> KeyGroupRange {
        KeyGroupRange { start, end }
    }

    /// The empty range.
    pub const EMPTY: KeyGroupRange = KeyGroupRange { start: 1, end: 0 };

    /// Number of key groups in the range (`u32::MAX` for `0..=u32::MAX`, which no valid
    /// max parallelism allows but a crafted snapshot may record).
    pub fn len(&self) -> u32 {
        if self.end < self.start { 0 } else { (self.end - self.start).saturating_add(1) }
    }

    /// True when the range holds no key group.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when `key_group` lies in the range.
    #[inline]
    pub fn contains(&self, key_group: u32) -> bool {
        key_group >= self.start && key_group <= self.end
    }

    /// The key groups in the range, in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + use<> {
        let (start, len) = (self.start, self.len());
        (0..len).map(move |offset| start + offset)
    }

    /// The common part of two ranges.
    pub fn intersection(&self, other: &KeyGroupRange) -> KeyGroupRange {
        let start = self.start.max(other.start);
        let end = self.end.min(other.end);
        if end < start { KeyGroupRange::EMPTY } else { KeyGroupRange { start, end } }
    }
}

impl std::fmt::Display for KeyGroupRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() { write!(f, "[]") } else { write!(f, "[{}..={}]", self.start, self.end) }
    }
}

/// The key groups owned by subtask `operator_index` of `parallelism` under `max_parallelism`.
///
/// Requires `0 < parallelism <= max_parallelism <= 32768` and `operator_index < parallelism`;
/// callers validate those bounds when the job graph is built.
pub fn compute_key_group_range_for_operator_index(
    max_parallelism: u32,
    parallelism: u32,
    operator_index: u32,
) -> KeyGroupRange {
    let max_p = u64::from(max_parallelism);
    let p = u64::from(parallelism);
    let i = u64::from(operator_index);
    let start = (i * max_p).div_ceil(p);
    let end = ((i + 1) * max_p - 1) / p;
    KeyGroupRange { start: start as u32, end: end as u32 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_widest_range_has_a_length_without_overflow() {
        // A crafted snapshot may record it; printing it in the error must not panic.
        assert_eq!(KeyGroupRange::new(0, u32::MAX).len(), u32::MAX);
        assert!(!KeyGroupRange::new(0, u32::MAX).to_string().is_empty());
    }

    #[test]
    fn murmur3_matches_reference_vectors() {
        assert_eq!(murmur3_32(b""), 0);
        assert_eq!(murmur3_32(b"hello"), 0x248b_fa47);
        assert_eq!(murmur3_32(b"The quick brown fox jumps over the lazy dog"), 0x2e4f_f723);
        // Flink's MathUtils.murmurHash(1) mixes the int's 4 little-endian bytes: raw -68075478.
        assert_eq!(murmur3_32(&1i32.to_le_bytes()) as i32, -68_075_478);
        assert_eq!(non_negative(murmur3_32(&1i32.to_le_bytes())), 68_075_478);
    }

    proptest! {
        #[test]
        fn streaming_murmur_equals_one_shot(data in proptest::collection::vec(any::<u8>(), 0..64), cuts in proptest::collection::vec(0usize..64, 0..5)) {
            let mut hasher = Murmur3::default();
            let mut start = 0;
            let mut cuts = cuts;
            cuts.sort_unstable();
            for cut in cuts {
                let cut = cut.min(data.len());
                if cut >= start {
                    hasher.write(&data[start..cut]);
                    start = cut;
                }
            }
            hasher.write(&data[start..]);
            prop_assert_eq!(hasher.finish(), murmur3_32(&data));
        }
    }

    #[test]
    fn non_negative_follows_flink() {
        assert_eq!(non_negative(5), 5);
        assert_eq!(non_negative((-5i32) as u32), 5);
        assert_eq!(non_negative(i32::MIN as u32), 0);
    }

    #[test]
    fn default_max_parallelism_matches_flink() {
        assert_eq!(compute_default_max_parallelism(1), 128);
        assert_eq!(compute_default_max_parallelism(85), 128);
        assert_eq!(compute_default_max_parallelism(86), 256);
        assert_eq!(compute_default_max_parallelism(100), 256);
        assert_eq!(compute_default_max_parallelism(1000), 2048);
        assert_eq!(compute_default_max_parallelism(21_845), 32_768);
        assert_eq!(compute_default_max_parallelism(30_000), 32_768);
        assert_eq!(compute_default_max_parallelism(32_768), 32_768);
    }

    #[test]
    fn ranges_for_known_cases() {
        assert_eq!(compute_key_group_range_for_operator_index(128, 1, 0), KeyGroupRange::new(0, 127));
        assert_eq!(compute_key_group_range_for_operator_index(128, 2, 0), KeyGroupRange::new(0, 63));
        assert_eq!(compute_key_group_range_for_operator_index(128, 2, 1), KeyGroupRange::new(64, 127));
        assert_eq!(compute_key_group_range_for_operator_index(10, 3, 0), KeyGroupRange::new(0, 3));
        assert_eq!(compute_key_group_range_for_operator_index(10, 3, 1), KeyGroupRange::new(4, 6));
        assert_eq!(compute_key_group_range_for_operator_index(10, 3, 2), KeyGroupRange::new(7, 9));
    }

    #[test]
    fn intersection_and_iteration() {
        let a = KeyGroupRange::new(0, 63);
        let b = KeyGroupRange::new(40, 100);
        assert_eq!(a.intersection(&b), KeyGroupRange::new(40, 63));
        assert!(a.intersection(&KeyGroupRange::new(64, 70)).is_empty());
        assert_eq!(KeyGroupRange::new(3, 5).iter().collect::<Vec<_>>(), vec![3, 4, 5]);
        assert_eq!(KeyGroupRange::EMPTY.iter().count(), 0);
    }

    proptest! {
        #[test]
        fn every_key_group_has_exactly_one_owner(max_p in 1u32..=32_768, p_seed in any::<u32>()) {
            let p = 1 + p_seed % max_p;
            let mut next_expected = 0u32;
            for index in 0..p {
                let range = compute_key_group_range_for_operator_index(max_p, p, index);
                // Ranges are contiguous, ordered and together cover [0, max_p).
                prop_assert_eq!(range.start, next_expected);
                next_expected = range.end.wrapping_add(1);
                // The owner formula agrees with the range at both ends.
                if !range.is_empty() {
                    prop_assert_eq!(compute_operator_index_for_key_group(max_p, p, range.start), index);
                    prop_assert_eq!(compute_operator_index_for_key_group(max_p, p, range.end), index);
                }
            }
            prop_assert_eq!(next_expected, max_p);
        }

        #[test]
        fn owner_formula_and_ranges_agree_for_every_group(max_p in 1u32..=4096, p_seed in any::<u32>()) {
            let p = 1 + p_seed % max_p;
            for group in 0..max_p {
                let owner = compute_operator_index_for_key_group(max_p, p, group);
                prop_assert!(owner < p);
                let range = compute_key_group_range_for_operator_index(max_p, p, owner);
                prop_assert!(range.contains(group));
            }
        }

        #[test]
        fn keys_land_in_a_valid_group_and_the_group_is_stable(key in any::<u64>(), max_p in 1u32..=32_768) {
            let group = assign_to_key_group(&key, max_p);
            prop_assert!(group < max_p);
            prop_assert_eq!(group, assign_to_key_group(&key, max_p));
        }

        #[test]
        fn string_keys_land_in_a_valid_group(key in ".*", max_p in 1u32..=32_768) {
            prop_assert!(assign_to_key_group(&key, max_p) < max_p);
        }
    }
}
