//! CPU_REPACK: weights stored 8 rows at a time in an interleaved layout that the repacked matmul
//! kernels (`kernels::repack`) read with one load per 8 rows (ggml's CPU_REPACK idea; the layout
//! is this crate's own, it is never written to files).
//!
//! A group of 8 consecutive rows is stored block by block: for block `b`, each field of the
//! block (ggml's struct, `src/ggml-common.h`) appears once for the 8 rows, scales first. Scalar fields (scales, mins, `d`) are the 8 rows' fields one after the other. Quant
//! fields are interleaved in 4-byte chunks: chunk `c` of row `r` lands at byte `32 c + 4 r`, so
//! one 32-byte load holds the same 4 (or 8, two nibbles per byte) elements of all 8 rows. The
//! K-quants' sub-block scales are stored transposed (byte `j` of row `r` at `8 j + r`). The
//! layout has exactly the plain size, so a repacked tensor costs no extra memory, and the plain
//! bytes are not kept: `Buffer::set_tensor` writes the interleaved form directly.

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Name of the repacked buffer type.
pub(crate) const REPACK_NAME: &str = "CPU_REPACK";

/// Rows interleaved together.
pub const REPACK_ROWS: usize = 8;

#[derive(Clone, Copy)]
enum Field {
    /// `n` bytes per row, stored for the 8 rows one after the other.
    Plain(usize),
    /// `n` bytes per row (a multiple of 4), interleaved in 4-byte chunks.
    Chunk4(usize),
    /// `n` bytes per row stored transposed: byte `j` of row `r` at `8 j + r` (per-sub-block
    /// scales, so that one 8-byte load gives a sub-block's scales for the 8 rows).
    Transposed(usize),
}

/// The fields of one block of each repackable type in their repacked order (scales first, so a
/// kernel walks each group block front to back), with their byte offsets in ggml's struct.
fn fields(dtype: DType) -> Option<&'static [(usize, Field)]> {
    use Field::{Chunk4, Plain, Transposed};
    Some(match dtype {
        DType::Q4_0 | DType::IQ4_NL => &[(0, Plain(2)), (2, Chunk4(16))],
        DType::MXFP4 => &[(0, Plain(1)), (1, Chunk4(16))],
        DType::Q4_K => &[(0, Plain(2)), (2, Plain(2)), (4, Transposed(12)), (16, Chunk4(128))],
        DType::Q6_K => {
            &[(208, Plain(2)), (192, Transposed(16)), (0, Chunk4(128)), (128, Chunk4(64))]
        }
        DType::Q2_K => &[(80, Plain(2)), (82, Plain(2)), (0, Transposed(16)), (16, Chunk4(64))],
        DType::TQ2_0 => &[(64, Plain(2)), (0, Chunk4(64))],
        _ => return None,
    })
}

/// The types with a repacked layout (and repacked matmul kernels).
pub const REPACK_TYPES: [DType; 7] =
    [DType::Q4_0, DType::IQ4_NL, DType::MXFP4, DType::Q4_K, DType::Q6_K, DType::Q2_K, DType::TQ2_0];

pub(crate) fn shape4(ne: &[usize]) -> Result<[usize; 4]> {
    if ne.is_empty() || ne.len() > 4 {
        return Err(Error::arg(format!("tensor shape {ne:?} must have 1 to 4 dims")));
    }
    let mut out = [1usize; 4];
    out[..ne.len()].copy_from_slice(ne);
    Ok(out)
}

/// Bytes of a contiguous tensor in ggml's plain layout.
pub(crate) fn plain_bytes(dtype: DType, ne: &[usize; 4]) -> Result<usize> {
    if !ne[0].is_multiple_of(dtype.block_size()) {
        return Err(Error::arg(format!(
            "{dtype}: row length {} is not a multiple of the block size {}",
            ne[0],
            dtype.block_size()
        )));
    }
    let row = dtype.row_bytes(ne[0]);
    ne[1..]
        .iter()
        .try_fold(row, |acc, &n| acc.checked_mul(n))
        .ok_or(Error::Overflow { what: "tensor size" })
}

/// Ok when a tensor of `dtype` and shape `ne` can be stored repacked; otherwise an error saying
/// why (the type has no repacked kernels, or the rows do not come in groups of 8).
pub fn check(dtype: DType, ne: &[usize; 4]) -> Result<()> {
    if fields(dtype).is_none() {
        return Err(Error::Unsupported {
            op: "repack",
            backend: "CPU".into(),
            msg: format!(
                "{dtype} has no repacked layout (supported: {})",
                REPACK_TYPES.map(|t| t.name()).join(", ")
            ),
        });
    }
    if !ne[1].is_multiple_of(REPACK_ROWS) || ne[0] == 0 {
        return Err(Error::Unsupported {
            op: "repack",
            backend: "CPU".into(),
            msg: format!(
                "{dtype} {ne:?}: repacking needs a multiple of {REPACK_ROWS} rows (ne[1]) and a non-empty row"
            ),
        });
    }
    plain_bytes(dtype, ne).map(|_| ())
}

/// True when [`check`] passes: the device stores such a tensor repacked when asked to.
pub fn supports(dtype: DType, ne: &[usize]) -> bool {
    shape4(ne).is_ok_and(|ne| check(dtype, &ne).is_ok())
}

/// Rearranges `src` (plain layout) into `dst` (interleaved); both are `plain_bytes` long.
pub(crate) fn repack(dtype: DType, ne: &[usize; 4], src: &[u8], dst: &mut [u8]) -> Result<()> {
    transform(dtype, ne, src, dst, true)
}

/// The inverse of [`repack`]: the plain layout back from the interleaved one.
pub(crate) fn unpack(dtype: DType, ne: &[usize; 4], src: &[u8], dst: &mut [u8]) -> Result<()> {
    transform(dtype, ne, src, dst, false)
}

fn transform(dtype: DType, ne: &[usize; 4], src: &[u8], dst: &mut [u8], pack: bool) -> Result<()> {
    check(dtype, ne)?;
    let fl = fields(dtype).unwrap_or(&[]);
    let bs = dtype.type_size();
    let nb = ne[0] / dtype.block_size();
    let row = nb * bs;
    let n = plain_bytes(dtype, ne)?;
    if src.len() != n || dst.len() != n {
        return Err(Error::arg(format!("repack: {dtype} {ne:?} needs {n} bytes")));
    }
    let groups = n / (row * REPACK_ROWS);
    for g in 0..groups {
        let base = g * row * REPACK_ROWS;
        for b in 0..nb {
            let packed = base + b * bs * REPACK_ROWS;
            move_block(fl, src, dst, |r| base + r * row + b * bs, packed, pack);
        }
    }
    Ok(())
}

/// Block `b` of an 8-row group back in the plain layout: `packed` is the group's block `b`
/// (`REPACK_ROWS * type_size` bytes at `b * REPACK_ROWS * type_size` from the group's start),
/// `plain` receives the 8 rows' blocks one after the other. For readers of repacked weights
/// that want ggml's blocks (the integer GEMM's unpackers).
pub(crate) fn plain_group_block(dtype: DType, packed: &[u8], plain: &mut [u8]) -> Result<()> {
    let fl = fields(dtype).ok_or_else(|| Error::arg(format!("{dtype} has no repacked layout")))?;
    let bs = dtype.type_size();
    if packed.len() != bs * REPACK_ROWS || plain.len() != bs * REPACK_ROWS {
        return Err(Error::arg(format!("repack: a {dtype} group block is {} bytes", bs * 8)));
    }
    move_block(fl, packed, plain, |r| r * bs, 0, false);
    Ok(())
}

/// Moves one block of 8 rows between the plain layout (row `r`'s block at `plain_of(r)`) and
/// the interleaved one (at `packed`), in the direction `pack` says.
fn move_block(
    fl: &[(usize, Field)],
    src: &[u8],
    dst: &mut [u8],
    plain_of: impl Fn(usize) -> usize,
    packed: usize,
    pack: bool,
) {
    let mut po = packed;
    for &(fo, f) in fl {
        match f {
            Field::Plain(len) => {
                for r in 0..REPACK_ROWS {
                    copy(src, dst, plain_of(r) + fo, po + r * len, len, pack);
                }
                po += REPACK_ROWS * len;
            }
            Field::Transposed(len) => {
                for j in 0..len {
                    for r in 0..REPACK_ROWS {
                        copy(src, dst, plain_of(r) + fo + j, po + REPACK_ROWS * j + r, 1, pack);
                    }
                }
                po += REPACK_ROWS * len;
            }
            Field::Chunk4(len) => {
                for c in 0..len / 4 {
                    for r in 0..REPACK_ROWS {
                        copy(src, dst, plain_of(r) + fo + 4 * c, po + 32 * c + 4 * r, 4, pack);
                    }
                }
                po += REPACK_ROWS * len;
            }
        }
    }
}

#[inline(always)]
fn copy(src: &[u8], dst: &mut [u8], plain: usize, packed: usize, len: usize, pack: bool) {
    if pack {
        dst[packed..packed + len].copy_from_slice(&src[plain..plain + len]);
    } else {
        dst[plain..plain + len].copy_from_slice(&src[packed..packed + len]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_sizes_match_the_block_sizes() {
        for t in REPACK_TYPES {
            let sum: usize = fields(t)
                .unwrap()
                .iter()
                .map(|(_, f)| match *f {
                    Field::Plain(n) | Field::Chunk4(n) | Field::Transposed(n) => n,
                })
                .sum();
            assert_eq!(sum, t.type_size(), "{t}");
        }
    }

    #[test]
    fn repack_then_unpack_is_identity() {
        for t in REPACK_TYPES {
            let ne = [t.block_size() * 3, 16, 2, 1];
            let n = plain_bytes(t, &ne).unwrap();
            let src: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
            let mut packed = vec![0u8; n];
            let mut back = vec![0u8; n];
            repack(t, &ne, &src, &mut packed).unwrap();
            assert_ne!(packed, src, "{t}");
            unpack(t, &ne, &packed, &mut back).unwrap();
            assert_eq!(back, src, "{t}");
        }
        assert!(check(DType::Q8_0, &[32, 8, 1, 1]).is_err());
        assert!(check(DType::Q4_0, &[32, 12, 1, 1]).is_err());
    }
}
