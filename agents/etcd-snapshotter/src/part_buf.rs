//! The buffers the encoder fills with parts: anonymous mappings, reused within one run.
//!
//! A mapping of its own, not a heap allocation: glibc serves the successors of a freed 8 MiB buffer from its
//! arenas (its mmap threshold rises to the largest block freed) and keeps up to twice that per arena once the
//! snapshot is done: 9 MiB of an idle agent's 31.9 MiB on glibc (`cargo xtask bench idle`, docs/benchmarks.md).
//! A mapping goes back to the kernel when the run is over, whatever the allocator.
//!
//! Reused within the run, not mapped afresh per part: a fresh mapping faults in and zeroes every page as the
//! encoder first writes it, which was 87% of the agent's page faults (about 44,000 at 256 MiB) and about 0.2 s of
//! CPU on the encoder's thread, the critical one (`perf record -e page-faults`, `bench snapshot`). A part whose
//! last reference is dropped (uploaded, spilled to disk, hashed) goes back to its pool; the pool holds no more
//! buffers than were ever alive at once, which the memory budget bounds, and unmaps them all when the encoder
//! is dropped. A part outliving its pool is unmapped when dropped.

use std::io;
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use memmap2::MmapMut;

type Free = Mutex<Vec<MmapMut>>;

/// Free buffers of one size, for one encoder.
pub struct PartPool {
    size: usize,
    free: Arc<Free>,
}

impl PartPool {
    pub fn new(size: usize) -> Self {
        Self { size: size.max(1), free: Arc::default() }
    }

    /// An empty buffer of the pool's size: a returned one if any, else a new mapping.
    pub fn take(&self) -> io::Result<PartBuf> {
        let reused = self.free.lock().expect("part pool lock").pop();
        let map = match reused {
            Some(map) => map,
            None => MmapMut::map_anon(self.size)?,
        };
        Ok(PartBuf { map, len: 0, home: Arc::downgrade(&self.free) })
    }

    /// Buffers waiting for reuse.
    #[cfg(test)]
    fn free_len(&self) -> usize {
        self.free.lock().expect("part pool lock").len()
    }
}

/// A part being filled.
pub struct PartBuf {
    map: MmapMut,
    pub len: usize,
    home: Weak<Free>,
}

impl PartBuf {
    /// A buffer of its own, returned to no pool (the short last part's placeholder).
    pub fn unpooled(size: usize) -> io::Result<Self> {
        Ok(Self { map: MmapMut::map_anon(size.max(1))?, len: 0, home: Weak::new() })
    }

    pub fn capacity(&self) -> usize {
        self.map.len()
    }

    /// Appends what fits of `bytes`; returns how many bytes were taken.
    pub fn fill(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(self.capacity() - self.len);
        self.map[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
        n
    }

    /// The filled bytes, without a copy; the buffer goes back to its pool when the last reference is dropped.
    pub fn into_bytes(self) -> Bytes {
        let len = self.len;
        Bytes::from_owner(Returning { map: Some(self.map), home: self.home }).slice(..len)
    }
}

/// A filled buffer owned by `Bytes`.
struct Returning {
    map: Option<MmapMut>,
    home: Weak<Free>,
}

impl AsRef<[u8]> for Returning {
    fn as_ref(&self) -> &[u8] {
        self.map.as_deref().expect("present until dropped")
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        if let (Some(map), Some(free)) = (self.map.take(), self.home.upgrade()) {
            free.lock().expect("part pool lock").push(map);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_part_is_reused_and_the_next_part_holds_only_its_own_bytes() {
        let pool = PartPool::new(8);
        let mut first = pool.take().unwrap();
        assert_eq!(first.fill(b"0123456789"), 8, "only what fits");
        let first = first.into_bytes();
        assert_eq!(&first[..], b"01234567");
        let address = first.as_ptr();
        drop(first);
        assert_eq!(pool.free_len(), 1);
        let mut second = pool.take().unwrap();
        assert_eq!(pool.free_len(), 0);
        second.fill(b"ab");
        let second = second.into_bytes();
        assert_eq!(second.as_ptr(), address, "the same mapping");
        assert_eq!(&second[..], b"ab", "nothing of the previous part shows");
    }

    #[test]
    fn a_part_alive_while_another_is_filled_is_not_handed_out_twice() {
        let pool = PartPool::new(4);
        let mut a = pool.take().unwrap();
        a.fill(b"aaaa");
        let a = a.into_bytes();
        let mut b = pool.take().unwrap();
        b.fill(b"bbbb");
        let b = b.into_bytes();
        assert_eq!((&a[..], &b[..]), (&b"aaaa"[..], &b"bbbb"[..]));
        let slice = a.slice(1..3);
        drop(a);
        assert_eq!(pool.free_len(), 0, "a slice still holds the buffer");
        drop(slice);
        assert_eq!(pool.free_len(), 1);
    }

    #[test]
    fn parts_outliving_their_pool_are_unmapped_not_returned() {
        let pool = PartPool::new(4);
        let mut part = pool.take().unwrap();
        part.fill(b"xy");
        let part = part.into_bytes();
        drop(pool);
        assert_eq!(&part[..], b"xy");
        drop(part);
    }
}
