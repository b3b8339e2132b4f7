//! Keys and their canonical bytes: the only input to key-group assignment.
//!
//! A key's canonical bytes are its postcard encoding (a documented, stable wire format), so
//! routing and snapshots never depend on memory layout or on Rust's randomized hashers.

use std::fmt::Debug;
use std::hash::Hash;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::keygroups::Murmur3;
#[cfg(test)]
use crate::keygroups::murmur3_32;

/// Keys encoded on the stack up to this size; longer keys take one allocation.
const KEY_BYTES_INLINE_MAX: usize = 128;

/// A type usable as the key of a keyed stream.
///
/// Implemented for every `Serialize + DeserializeOwned + Eq + Hash + Clone` type; the key
/// group depends only on the postcard encoding of the value.
pub trait Key: Serialize + DeserializeOwned + Eq + Hash + Clone + Debug + Send + Sync + 'static {
    /// The stable 32-bit hash of the key's canonical bytes (murmur3 x86_32, seed 0).
    #[inline]
    fn stable_hash(&self) -> u32 {
        // Hash the postcard bytes as the serializer produces them: no buffer, no copy.
        // postcard only fails on sequences of unknown length, which keys never are; such a
        // key would land in key group 0 rather than fail the record.
        postcard::serialize_with_flavor(self, HashFlavor(Murmur3::default())).unwrap_or_default()
    }
}

impl<T> Key for T where T: Serialize + DeserializeOwned + Eq + Hash + Clone + Debug + Send + Sync + 'static {}

/// A postcard output that feeds the bytes to a murmur3 hasher.
struct HashFlavor(Murmur3);

impl postcard::ser_flavors::Flavor for HashFlavor {
    type Output = u32;

    #[inline]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.write(data);
        Ok(())
    }

    #[inline]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.write_byte(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<u32> {
        Ok(self.0.finish())
    }
}

/// Calls `f` with the canonical bytes of `key`, without allocating for small keys.
pub fn with_canonical_bytes<K: Serialize + ?Sized, R>(key: &K, f: impl FnOnce(&[u8]) -> R) -> R {
    let mut inline = [0u8; KEY_BYTES_INLINE_MAX];
    match postcard::to_slice(key, &mut inline) {
        Ok(bytes) => f(bytes),
        Err(_) => {
            // Larger than the inline buffer (or a serializer error, which postcard only
            // reports for buffer exhaustion on these types): encode into the heap.
            let bytes = postcard::to_allocvec(key).unwrap_or_default();
            f(&bytes)
        }
    }
}

/// The canonical bytes of `key` as an owned vector (snapshots, tests).
pub fn canonical_bytes<K: Serialize + ?Sized>(key: &K) -> Vec<u8> {
    with_canonical_bytes(key, |bytes| bytes.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_keys_hash_their_postcard_bytes() {
        let small = 42u64;
        assert_eq!(small.stable_hash(), murmur3_32(&postcard::to_allocvec(&small).unwrap()));
        let large = "x".repeat(1000);
        let text = "hello".to_string();
        assert_eq!(text.stable_hash(), murmur3_32(&postcard::to_allocvec(&text).unwrap()));
        let tuple = (7u64, "k".to_string(), -3i32);
        assert_eq!(tuple.stable_hash(), murmur3_32(&postcard::to_allocvec(&tuple).unwrap()));
        assert_eq!(large.stable_hash(), murmur3_32(&postcard::to_allocvec(&large).unwrap()));
    }

    #[test]
    fn canonical_bytes_are_the_documented_postcard_encoding() {
        // postcard: unsigned varint, strings as varint length then UTF-8 bytes.
        assert_eq!(canonical_bytes(&300u64), vec![0xac, 0x02]);
        assert_eq!(canonical_bytes("ab"), vec![2, b'a', b'b']);
    }
}
