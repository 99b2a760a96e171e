//! Arena allocator for intermediate tensors: best-fit over a free list, merging neighbours, in the
//! spirit of ggml-alloc's dynamic allocator. It only computes offsets; the plan allocates the arena
//! once with the peak size.

use crate::buffer::BUFFER_ALIGNMENT;

use crate::error::{Error, Result};
use crate::ops::align_up;

/// `align_up` for sizes that come from the graph: `Err` instead of wrapping near `usize::MAX`.
pub(crate) fn checked_align_up(n: usize, a: usize) -> Result<usize> {
    n.div_ceil(a).checked_mul(a).ok_or(Error::Overflow { what: "plan arena size" })
}

#[derive(Default)]
pub(crate) struct ArenaAlloc {
    /// Free blocks (offset, size), sorted by offset, never adjacent to each other.
    free: Vec<(usize, usize)>,
    /// End of the highest block handed out or freed.
    top: usize,
    /// Peak of `top`.
    pub peak: usize,
}

impl ArenaAlloc {
    /// Reserves `size` bytes (rounded up to the alignment); returns the offset, or `Err` when the
    /// arena would pass `isize::MAX` bytes.
    pub fn alloc(&mut self, size: usize) -> Result<usize> {
        let size = checked_align_up(size.max(1), BUFFER_ALIGNMENT)?;
        let mut best: Option<usize> = None;
        for (i, &(_, s)) in self.free.iter().enumerate() {
            if s >= size && best.is_none_or(|b| s < self.free[b].1) {
                best = Some(i);
            }
        }
        if let Some(i) = best {
            let (off, s) = self.free[i];
            if s == size {
                self.free.remove(i);
            } else {
                self.free[i] = (off + size, s - size);
            }
            return Ok(off);
        }
        // Grow at the top, absorbing a free block that ends there.
        let mut off = self.top;
        if let Some(&(o, s)) = self.free.last()
            && o + s == self.top
        {
            off = o;
            self.free.pop();
        }
        self.top = off
            .checked_add(size)
            .filter(|&t| t <= isize::MAX as usize)
            .ok_or(Error::Overflow { what: "plan arena size" })?;
        self.peak = self.peak.max(self.top);
        Ok(off)
    }

    /// Returns a block obtained from `alloc` with the same `size`.
    pub fn free(&mut self, off: usize, size: usize) {
        // `alloc` succeeded with this size, so the rounding cannot overflow.
        let size = align_up(size.max(1), BUFFER_ALIGNMENT);
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, size));
        // Merge with the next block, then the previous one.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_freed_blocks_and_merges() {
        let mut a = ArenaAlloc::default();
        let x = a.alloc(100).unwrap();
        let y = a.alloc(100).unwrap();
        let z = a.alloc(100).unwrap();
        assert_eq!((x, y, z), (0, 128, 256));
        a.free(x, 100);
        a.free(y, 100);
        // Merged 256-byte hole at 0 takes a 200-byte block.
        assert_eq!(a.alloc(200).unwrap(), 0);
        assert_eq!(a.peak, 384);
        a.free(z, 100);
        assert_eq!(a.alloc(64).unwrap(), 256);
    }
}
