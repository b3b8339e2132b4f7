//! Test support for decoders of snapshot bytes: mutations of a valid encoding, and an
//! allocator that refuses, on the threads that ask it to, any single allocation above a cap.
//!
//! A test binary installs [`CappedAlloc`] as its global allocator and runs each decode in
//! [`with_allocation_cap`]: a decoder that trusts a length or count it read allocates the
//! claimed size at once, and the test sees it as an error instead of the OOM killer.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    /// The cap of this thread (0: none) and the largest request above it.
    static CAP: Cell<usize> = const { Cell::new(0) };
    static REFUSED: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, refusing (null) a request above the calling thread's cap.
pub struct CappedAlloc;

impl CappedAlloc {
    fn allowed(size: usize) -> bool {
        let cap = CAP.try_with(Cell::get).unwrap_or(0);
        if cap == 0 || size <= cap {
            return true;
        }
        let _ = REFUSED.try_with(|refused| refused.set(refused.get().max(size)));
        false
    }
}

// SAFETY: every call is forwarded unchanged to `System`, or refused with a null pointer,
// which `GlobalAlloc` allows.
unsafe impl GlobalAlloc for CappedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Self::allowed(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Self::allowed(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !Self::allowed(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` with single allocations on this thread capped at `cap` bytes; the result, or
/// the largest refused request (with [`CappedAlloc`] installed, a refusal that `f` does not
/// handle aborts the process with "memory allocation of N bytes failed").
pub fn with_allocation_cap<T>(cap: usize, f: impl FnOnce() -> T) -> Result<T, usize> {
    let before = CAP.with(|c| c.replace(cap));
    REFUSED.with(|r| r.set(0));
    let result = f();
    CAP.with(|c| c.set(before));
    match REFUSED.with(Cell::get) {
        0 => Ok(result),
        refused => Err(refused),
    }
}

/// One change to an encoding: the kind (taken modulo 6), a position (modulo the length) and
/// a value.
pub type Mutation = (u8, usize, u64);

/// Values a crafted length or count takes: just past the data, 2^32, 2^36, 2^63-1, 2^64-1.
pub const HUGE: [u64; 6] = [200, 1 << 16, 1 << 32, 1 << 36, i64::MAX as u64, u64::MAX];

/// Appends `value` as an unsigned LEB128 varint (postcard's lengths and integers).
fn varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// `bytes` changed by each of `mutations` in turn: flip bits of a byte, insert a byte,
/// delete a byte, truncate, overwrite a byte with a huge varint (a length or count), or
/// insert one.
pub fn mutate(bytes: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for &(kind, position, value) in mutations {
        let at = if out.is_empty() { 0 } else { position % out.len() };
        match kind % 6 {
            0 if !out.is_empty() => out[at] ^= (value as u8).max(1),
            1 => out.insert(at, value as u8),
            2 if !out.is_empty() => {
                out.remove(at);
            }
            3 => out.truncate(at),
            4 | 5 => {
                let mut huge = Vec::new();
                varint(HUGE[(value % HUGE.len() as u64) as usize], &mut huge);
                let end = if kind % 6 == 4 { (at + 1).min(out.len()) } else { at };
                out.splice(at..end, huge);
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_change_the_bytes_as_named() {
        assert_eq!(mutate(&[1, 2, 3], &[(3, 1, 0)]), vec![1]);
        assert_eq!(mutate(&[1, 2, 3], &[(2, 0, 0)]), vec![2, 3]);
        assert_eq!(mutate(&[1, 2, 3], &[(1, 2, 9)]), vec![1, 2, 9, 3]);
        assert_eq!(mutate(&[1, 2, 3], &[(0, 0, 1)]), vec![0, 2, 3]);
        assert_eq!(mutate(&[1, 2, 3], &[(4, 0, 0)]), vec![0xc8, 0x01, 2, 3]);
        assert_eq!(mutate(&[], &[(0, 5, 1), (2, 5, 1)]), Vec::<u8>::new());
    }

    #[test]
    fn without_the_allocator_installed_nothing_is_refused() {
        assert_eq!(with_allocation_cap(16, || vec![0u8; 1024].len()), Ok(1024));
    }
}
