//! cpy / dup / cont / cast: copies src0 into dst element by element in logical order, converting
//! between F32 and F16; same-type copies of block types go row by row.

use super::{NodeCtx, split, unravel_row};
use crate::dtype::DType;
use crate::error::Result;
use crate::quant::util::{fp16_to_fp32, fp32_to_fp16};

#[inline(always)]
unsafe fn load(p: *const u8, dt: DType) -> f32 {
    // SAFETY: the caller passes a pointer to one element of type `dt`.
    unsafe {
        match dt {
            DType::F16 => fp16_to_fp32((p as *const u16).read_unaligned()),
            _ => (p as *const f32).read_unaligned(),
        }
    }
}

#[inline(always)]
unsafe fn store(p: *mut u8, dt: DType, v: f32) {
    // SAFETY: the caller passes a pointer to one element of type `dt`.
    unsafe {
        match dt {
            DType::F16 => (p as *mut u16).write_unaligned(fp32_to_fp16(v)),
            _ => (p as *mut f32).write_unaligned(v),
        }
    }
}

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    if a.dtype == d.dtype && a.dtype.block_size() > 1 {
        // Block types: same shape, contiguous rows (checked at build): copy row bytes.
        let bytes = a.dtype.row_bytes(a.ne[0]);
        let (r0, r1) = split(a.nrows(), ith, ctx.nth);
        for r in r0..r1 {
            let (i1, i2, i3) = unravel_row(r, &a.ne);
            // SAFETY: same shapes; indices in range; rows of `bytes` validated; own rows only.
            unsafe { std::ptr::copy_nonoverlapping(a.row(i1, i2, i3), d.row(i1, i2, i3), bytes) };
        }
        return Ok(());
    }
    let same = a.dtype == d.dtype;
    let ts = a.dtype.type_size();
    let ne0 = a.ne[0];
    let (r0, r1) = split(a.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &a.ne);
        // Flat index of the row's first element, mapped into dst's shape.
        let mut k = r * ne0;
        let mut j = [0usize; 4];
        j[0] = k % d.ne[0];
        k /= d.ne[0];
        j[1] = k % d.ne[1];
        k /= d.ne[1];
        j[2] = k % d.ne[2];
        j[3] = k / d.ne[2];
        // SAFETY: a's indices are below its ne; j walks dst's shape in order and stays below its
        // ne because both tensors have the same number of elements; extents validated at plan
        // time. Each worker writes the dst elements of its own src rows (disjoint flat ranges).
        unsafe {
            let pa = a.row(i1, i2, i3);
            for i0 in 0..ne0 {
                let sp = pa.add(i0 * a.nb[0]);
                let dp =
                    d.ptr.add(j[0] * d.nb[0] + j[1] * d.nb[1] + j[2] * d.nb[2] + j[3] * d.nb[3]);
                if same {
                    std::ptr::copy_nonoverlapping(sp, dp, ts);
                } else {
                    store(dp, d.dtype, load(sp, a.dtype));
                }
                j[0] += 1;
                if j[0] == d.ne[0] {
                    j[0] = 0;
                    j[1] += 1;
                    if j[1] == d.ne[1] {
                        j[1] = 0;
                        j[2] += 1;
                        if j[2] == d.ne[2] {
                            j[2] = 0;
                            j[3] += 1;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}
