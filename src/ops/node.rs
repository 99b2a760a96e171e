//! The node contract between the plan and the op drivers: a node with every tensor resolved to
//! an address and a layout ([`TView`]), as the plan hands it to `ops::compute`.

use crate::dtype::DType;
use crate::graph::{MAX_SRC, Op, TensorId};
use crate::quant::util::{bf16_to_fp32, fp16_to_fp32, fp32_to_bf16, fp32_to_fp16};
use std::marker::PhantomData;

/// `n` rounded up to a multiple of `a`.
pub(crate) fn align_up(n: usize, a: usize) -> usize {
    n.div_ceil(a) * a
}

/// A tensor's address and layout as the kernels see it.
///
/// The plan builds every `TView` so that it describes memory that stays valid for the whole
/// compute: `ptr` is aligned for `dtype` (graph build checks view offsets and strides against
/// `DType::align`, and roots start on aligned addresses), and every element `(i0, i1, i2, i3)`
/// below `ne` lies inside the tensor's allocation at `ptr + sum(i * nb)`. The typed accessors
/// below rely on exactly this, so the drivers that use them need no `unsafe` of their own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TView {
    pub ptr: *mut u8,
    pub dtype: DType,
    pub ne: [usize; 4],
    pub nb: [usize; 4],
    /// Weights stored in a CPU_REPACK buffer (8-row interleaved layout, `quant::repack`).
    pub repacked: bool,
    /// The node writes these bytes: the destination, and a source that shares memory with it
    /// (in place, where the graph allows only the destination's exact layout). Written views are
    /// not lent out as shared slices; drivers read them through [`DstRows::io`] or [`Out`].
    pub written: bool,
}

/// Element types the typed accessors hand out: plain numbers whose every bit pattern is valid.
pub(crate) trait Elem: bytemuck::Pod {
    /// True when a tensor of `dtype` stores elements of this type (checked in debug builds).
    fn holds(dtype: DType) -> bool;
}

macro_rules! elem {
    ($($t:ty => $($d:ident)|+;)*) => {$(
        impl Elem for $t {
            #[inline(always)]
            fn holds(dtype: DType) -> bool {
                matches!(dtype, $(DType::$d)|+)
            }
        }
    )*};
}

elem! {
    f32 => F32;
    f64 => F64;
    i32 => I32;
    i64 => I64;
    i16 => I16;
    i8 => I8;
    u16 => F16 | BF16 | I16;
}

impl TView {
    pub(crate) fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }
    pub(crate) fn nelements(&self) -> usize {
        self.ne.iter().product()
    }
    /// Address of element row (i1, i2, i3).
    ///
    /// # Safety
    /// The indices are below `ne[1..4]`; the plan validated that every such row lies inside the
    /// tensor's memory.
    #[inline(always)]
    pub(crate) unsafe fn row(&self, i1: usize, i2: usize, i3: usize) -> *mut u8 {
        // SAFETY: per the contract, the offset stays inside the tensor's allocation.
        unsafe { self.ptr.add(i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3]) }
    }

    /// The bytes of rows `rows` of matrix `(i2, i3)` when they lie back to back (`nb[1]` the
    /// length of a row of `ne[0]` elements) and the node does not write them, row `i` at `(i -
    /// rows.start) * nb[1]`, with that stride; `None` otherwise (or for indices outside `ne`).
    ///
    /// # Safety
    /// The slice is used only during the compute the view was built for (its memory stays valid
    /// and, as the view is not written, unwritten for that long).
    pub(crate) unsafe fn row_span<'a>(
        &self,
        rows: std::ops::Range<usize>,
        i2: usize,
        i3: usize,
    ) -> Option<(&'a [u8], usize)> {
        let rb = self.dtype.row_bytes(self.ne[0]);
        let whole = !self.written && self.nb[1] == rb && rows.start < rows.end;
        if !whole || rows.end > self.ne[1] || i2 >= self.ne[2] || i3 >= self.ne[3] {
            return None;
        }
        // SAFETY: the indices are below `ne`, so rows `rows` lie inside the tensor's memory (the
        // `TView` invariant); back to back (`nb[1]` is a row's length), the bytes from the first
        // row's start to the last row's end are exactly theirs. Valid and unwritten while used
        // (the caller's guarantee, and `written` is false).
        unsafe {
            Some((std::slice::from_raw_parts(self.row(rows.start, i2, i3), rows.len() * rb), rb))
        }
    }

    /// Typed address of element `(i0, i1, i2, i3)`: the one place the typed accessors turn
    /// indices into addresses. The indices are checked (a panic, caught by the executor, rather
    /// than a read outside the tensor); the element type and alignment in debug builds.
    #[inline(always)]
    fn elem_ptr<T: Elem>(&self, i0: usize, i1: usize, i2: usize, i3: usize) -> *mut T {
        assert!(
            i0 < self.ne[0] && i1 < self.ne[1] && i2 < self.ne[2] && i3 < self.ne[3],
            "element ({i0}, {i1}, {i2}, {i3}) outside {:?}",
            self.ne
        );
        debug_assert!(
            T::holds(self.dtype),
            "{} read as {}",
            self.dtype,
            std::any::type_name::<T>()
        );
        let off = i0 * self.nb[0] + i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3];
        // SAFETY: the indices are below `ne` (asserted), so the offset stays inside the tensor's
        // allocation (the `TView` invariant).
        let p = unsafe { self.ptr.add(off) } as *mut T;
        debug_assert!(p.is_aligned(), "misaligned {} at {p:p}", self.dtype);
        p
    }

    /// Element `(i0, i1, i2, i3)` of a source the node does not write.
    #[inline(always)]
    pub(crate) fn get<T: Elem>(&self, i0: usize, i1: usize, i2: usize, i3: usize) -> T {
        assert!(!self.written, "a written tensor is read through its destination rows");
        let p = self.elem_ptr::<T>(i0, i1, i2, i3);
        // SAFETY: `p` is in bounds and aligned (`elem_ptr`); nothing writes a tensor the node
        // only reads while the node runs.
        unsafe { p.read() }
    }

    /// Element `(i0, i1, i2, i3)` of an F32, F16, BF16 or I32 source the node does not write,
    /// as f32 (ggml's conversions).
    #[inline(always)]
    pub(crate) fn load(&self, i0: usize, i1: usize, i2: usize, i3: usize) -> f32 {
        match self.dtype {
            DType::F16 => fp16_to_fp32(self.get::<u16>(i0, i1, i2, i3)),
            DType::BF16 => bf16_to_fp32(self.get::<u16>(i0, i1, i2, i3)),
            DType::I32 => self.get::<i32>(i0, i1, i2, i3) as f32,
            _ => self.get::<f32>(i0, i1, i2, i3),
        }
    }

    /// Row `(i1, i2, i3)` of a source the node does not write, as a slice of `ne[0]` elements
    /// (the row must be contiguous: `nb[0]` is the element size).
    #[inline(always)]
    pub(crate) fn row_of<T: Elem>(&self, i1: usize, i2: usize, i3: usize) -> &[T] {
        assert!(!self.written, "a written tensor is read through its destination rows");
        assert!(self.ne[0] <= 1 || self.nb[0] == size_of::<T>(), "strided {} row", self.dtype);
        let n = self.ne[0];
        if n == 0 {
            return &[];
        }
        let p = self.elem_ptr::<T>(0, i1, i2, i3);
        // SAFETY: the row's first element is in bounds and aligned (`elem_ptr`) and its `n`
        // elements are contiguous (`nb[0]` = element size), so they lie inside the tensor; the
        // node does not write it (`written` is false), so no `&mut` to it exists meanwhile.
        unsafe { std::slice::from_raw_parts(p, n) }
    }

    /// Row `(i1, i2, i3)` of a source the node does not write, as the bytes of its blocks (any
    /// type, including block-quantized ones; rows must be contiguous).
    #[inline(always)]
    pub(crate) fn row_bytes(&self, i1: usize, i2: usize, i3: usize) -> &[u8] {
        assert!(!self.written, "a written tensor is read through its destination rows");
        let blocks = self.ne[0] / self.dtype.block_size();
        assert!(blocks <= 1 || self.nb[0] == self.dtype.type_size(), "strided {} row", self.dtype);
        assert!(i1 < self.ne[1] && i2 < self.ne[2] && i3 < self.ne[3], "row outside {:?}", self.ne);
        let n = self.dtype.row_bytes(self.ne[0]);
        // SAFETY: row (i1, i2, i3) is below `ne` (asserted) and its blocks are contiguous, so its
        // `row_bytes` lie inside the tensor; bytes need no alignment; the node does not write it.
        unsafe { std::slice::from_raw_parts(self.row(i1, i2, i3), n) }
    }

    /// The whole tensor as `nelements` values of `T`, for small contiguous sources (a vector
    /// of positions or of per-row values).
    #[inline(always)]
    pub(crate) fn as_slice<T: Elem>(&self) -> &[T] {
        assert!(!self.written, "a written tensor is read through its destination rows");
        assert!(self.is_dense::<T>(), "{} {:?} is not contiguous", self.dtype, self.ne);
        let n = self.nelements();
        if n == 0 {
            return &[];
        }
        let p = self.elem_ptr::<T>(0, 0, 0, 0);
        // SAFETY: dense (asserted), so the `n` elements from the aligned, in-bounds first one
        // are the tensor's own; the node does not write it.
        unsafe { std::slice::from_raw_parts(p, n) }
    }

    /// True when the elements are dense in ggml's order (`nb` = the contiguous strides).
    pub(crate) fn is_dense<T: Elem>(&self) -> bool {
        let mut stride = size_of::<T>();
        for d in 0..4 {
            if self.ne[d] > 1 && self.nb[d] != stride {
                return false;
            }
            stride *= self.ne[d];
        }
        true
    }

    /// True when `other` is this tensor's memory with this tensor's layout.
    fn same_layout(&self, other: &TView) -> bool {
        self.ptr == other.ptr && self.nb == other.nb && self.ne == other.ne
    }

    /// The byte range `[start, end)` the tensor's elements can touch.
    pub(crate) fn byte_range(&self) -> (usize, usize) {
        if self.nelements() == 0 {
            return (self.ptr as usize, self.ptr as usize);
        }
        let bs = self.dtype.block_size();
        let mut end = self.dtype.type_size();
        end += (self.ne[0] / bs).saturating_sub(1) * self.nb[0];
        for d in 1..4 {
            end += (self.ne[d] - 1) * self.nb[d];
        }
        (self.ptr as usize, self.ptr as usize + end)
    }

    /// True when the two tensors may touch the same bytes.
    pub(crate) fn overlaps(&self, other: &TView) -> bool {
        let (a0, a1) = self.byte_range();
        let (b0, b1) = other.byte_range();
        a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1
    }
}

/// Worker `ith`'s share of the destination's rows (`split(nrows, ith, nth)`), the only way the
/// typed accessors write a destination. Workers get disjoint row ranges and the graph keeps the
/// rows of any tensor an op writes apart in memory (`check_no_self_overlap`; fresh tensors are
/// dense), so the `&mut` rows handed out here never alias another worker's. Rows are lent one at
/// a time (`&mut self`), so a worker never holds two of them either.
pub(crate) struct DstRows<'a> {
    d: &'a TView,
    start: usize,
    end: usize,
}

impl<'a> DstRows<'a> {
    /// Flat rows `[start, end)` of the destination `d` for one worker.
    ///
    /// # Safety
    /// No other `DstRows` of the same node that is alive at the same time covers any of these
    /// rows: workers pass disjoint ranges (their `split`), and one worker holds one at a time.
    pub(crate) unsafe fn new(d: &'a TView, start: usize, end: usize) -> Self {
        assert!(d.written && start <= end && end <= d.nrows());
        DstRows { d, start, end }
    }

    /// The rows this worker owns, in order, with their indices (counted up, no divisions).
    pub(crate) fn range(&self) -> RowIter {
        let ne = &self.d.ne;
        let (i1, i2, i3) =
            if self.start < self.end { super::unravel_row(self.start, ne) } else { (0, 0, 0) };
        RowIter { r: self.start, end: self.end, i: [i1, i2, i3], ne: [ne[1], ne[2]] }
    }

    /// The flat indices of the rows this worker owns.
    pub(crate) fn flat(&self) -> std::ops::Range<usize> {
        self.start..self.end
    }

    /// The indices of one of this worker's rows, given as a flat index or a [`RowIdx`].
    #[inline(always)]
    fn own(&self, row: impl AsRow) -> (usize, usize, usize) {
        let (r, (i1, i2, i3)) = row.locate(&self.d.ne);
        assert!((self.start..self.end).contains(&r), "row {r} is not this worker's");
        // A `RowIdx` from another tensor's rows would name another row: check that it is `r`.
        assert!(
            i1 < self.d.ne[1]
                && i2 < self.d.ne[2]
                && r == i1 + self.d.ne[1] * (i2 + self.d.ne[2] * i3),
            "row indices do not match row {r}"
        );
        (i1, i2, i3)
    }

    /// Element `(i0, i1, i2, i3)` of source `src` as f32 (see [`TView::load`]). A source the
    /// node writes (in place) has the destination's layout, so the element is the
    /// destination's, and it must be in this worker's rows.
    #[inline(always)]
    pub(crate) fn load(&self, src: &TView, i0: usize, i1: usize, i2: usize, i3: usize) -> f32 {
        if !src.written {
            return src.load(i0, i1, i2, i3);
        }
        assert!(src.same_layout(self.d), "in-place source with a different layout");
        let r = i1 + self.d.ne[1] * (i2 + self.d.ne[2] * i3);
        assert!((self.start..self.end).contains(&r), "row {r} is not this worker's");
        let d = self.d;
        // SAFETY: in bounds and aligned (`elem_ptr`); the element is in this worker's rows, and
        // `&self` rules out a row lent by `&mut self` being alive.
        unsafe {
            match d.dtype {
                DType::F16 => fp16_to_fp32(d.elem_ptr::<u16>(i0, i1, i2, i3).read()),
                DType::BF16 => bf16_to_fp32(d.elem_ptr::<u16>(i0, i1, i2, i3).read()),
                DType::I32 => d.elem_ptr::<i32>(i0, i1, i2, i3).read() as f32,
                _ => d.elem_ptr::<f32>(i0, i1, i2, i3).read(),
            }
        }
    }

    /// Stores `v` as element `i0` of flat row `r` in the destination's type (F32, F16 or BF16
    /// rounded to nearest even, or I32 by a saturating cast).
    #[inline(always)]
    pub(crate) fn store(&mut self, r: impl AsRow, i0: usize, v: f32) {
        let (i1, i2, i3) = self.own(r);
        let d = self.d;
        // SAFETY: in bounds and aligned (`elem_ptr`); the row is this worker's alone and
        // `&mut self` rules out any lent row being alive.
        unsafe {
            match d.dtype {
                DType::F16 => d.elem_ptr::<u16>(i0, i1, i2, i3).write(fp32_to_fp16(v)),
                DType::BF16 => d.elem_ptr::<u16>(i0, i1, i2, i3).write(fp32_to_bf16(v)),
                // ggml converts with a C cast; Rust's saturating cast avoids undefined behaviour.
                DType::I32 => d.elem_ptr::<i32>(i0, i1, i2, i3).write(v as i32),
                _ => d.elem_ptr::<f32>(i0, i1, i2, i3).write(v),
            }
        }
    }

    /// Flat row `r` as the bytes of its blocks (any type; rows must be contiguous).
    #[inline(always)]
    pub(crate) fn bytes(&mut self, r: impl AsRow) -> &mut [u8] {
        let (i1, i2, i3) = self.own(r);
        let d = self.d;
        let blocks = d.ne[0] / d.dtype.block_size();
        assert!(blocks <= 1 || d.nb[0] == d.dtype.type_size(), "strided {} row", d.dtype);
        // SAFETY: the row is below `ne` (`own`) and its blocks are contiguous, so its
        // `row_bytes` lie inside the tensor; it is this worker's alone and lent once (`&mut
        // self`); bytes need no alignment.
        unsafe { std::slice::from_raw_parts_mut(d.row(i1, i2, i3), d.dtype.row_bytes(d.ne[0])) }
    }

    /// For kernels that take pointers: this worker's destination rows with the same rows of
    /// `src` (the destination's shape; the destination itself in place), as (row, destination
    /// start, source start), or `None` unless both have contiguous rows. The checks run once
    /// here instead of per row; dereferencing stays with the kernel call's `unsafe`, whose
    /// bound is `ne[0]` elements from each start (equal, or apart).
    pub(crate) fn row_ptrs<T: Elem>(
        &mut self,
        src: &TView,
    ) -> Option<impl Iterator<Item = (RowIdx, *mut T, *const T)> + use<'_, T>> {
        let d = self.d;
        assert_eq!(src.ne, d.ne, "source and destination shapes differ");
        let src = if src.written {
            assert!(src.same_layout(d), "in-place source with a different layout");
            d
        } else {
            src
        };
        if d.ne[0] == 0 || elem_stride::<T>(d) != 1 || elem_stride::<T>(src) != 1 {
            return None;
        }
        debug_assert!(T::holds(d.dtype) && T::holds(src.dtype));
        let (pd, ps, nd, ns) = (d.ptr, src.ptr, d.nb, src.nb);
        Some(self.range().map(move |r| {
            let (i1, i2, i3) = r.i();
            // The indices are below `ne` (the rows of this `DstRows`), so both addresses are
            // row starts inside their tensors (the `TView` invariant), aligned for T.
            let od = i1 * nd[1] + i2 * nd[2] + i3 * nd[3];
            let os = i1 * ns[1] + i2 * ns[2] + i3 * ns[3];
            let (yd, xs) = (pd.wrapping_add(od) as *mut T, ps.wrapping_add(os) as *const T);
            debug_assert!(
                yd == d.elem_ptr::<T>(0, i1, i2, i3) && yd.is_aligned() && xs.is_aligned()
            );
            (r, yd, xs)
        }))
    }

    /// All of this worker's rows as one slice (the destination must be dense).
    pub(crate) fn all<T: Elem>(&mut self) -> &mut [T] {
        let d = self.d;
        assert!(d.is_dense::<T>(), "{} {:?} is not contiguous", d.dtype, d.ne);
        let n = (self.end - self.start) * d.ne[0];
        if n == 0 {
            return &mut [];
        }
        let (i1, i2, i3) = self.own(self.start);
        let p = d.elem_ptr::<T>(0, i1, i2, i3);
        // SAFETY: the destination is dense, so rows [start, end) are the `n` elements from the
        // first one (in bounds and aligned, `elem_ptr`); they are this worker's alone and lent
        // once (`&mut self`).
        unsafe { std::slice::from_raw_parts_mut(p, n) }
    }

    /// Flat row `r` (one of this worker's) as a strided typed row.
    #[inline(always)]
    pub(crate) fn out<T: Elem>(&mut self, r: impl AsRow) -> Out<'_, T> {
        let (i1, i2, i3) = self.own(r);
        Out::new(self.d, i1, i2, i3)
    }

    /// Flat row `r` as a contiguous `&mut [T]` (`nb[0]` must be the element size).
    #[inline(always)]
    pub(crate) fn row<T: Elem>(&mut self, r: impl AsRow) -> &mut [T] {
        let (i1, i2, i3) = self.own(r);
        Out::new(self.d, i1, i2, i3).into_slice()
    }

    /// Flat row `r` of the destination together with the same row of `src`, a tensor of the
    /// destination's shape that may be the destination itself (in place).
    #[inline(always)]
    pub(crate) fn io<'s, T: Elem>(&'s mut self, src: &'s TView, r: impl AsRow) -> InOut<'s, T> {
        let (i1, i2, i3) = self.own(r);
        let out = Out::new(self.d, i1, i2, i3);
        if src.written {
            // The graph lets a written source share the destination's bytes only with the
            // destination's exact layout, so its row is this row.
            assert!(src.same_layout(self.d), "in-place source with a different layout");
            InOut::Same(out)
        } else {
            InOut::Two(Row::new(src, i1, i2, i3), out)
        }
    }
}

/// `nb[0]` in elements of `T`. A row of one element may have any stride (graph build aligns
/// only the strides of dims longer than 1); it is never stepped, so it counts as strided.
#[inline(always)]
fn elem_stride<T>(t: &TView) -> usize {
    if t.ne[0] > 1 {
        assert!(t.nb[0].is_multiple_of(size_of::<T>()), "stride of {} not in elements", t.dtype);
        t.nb[0] / size_of::<T>()
    } else if t.nb[0] == size_of::<T>() {
        1
    } else {
        usize::MAX
    }
}

/// One of a worker's destination rows: its flat index and its (i1, i2, i3).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowIdx {
    r: usize,
    i: (usize, usize, usize),
}

impl RowIdx {
    /// The flat row index.
    #[inline(always)]
    pub(crate) fn r(&self) -> usize {
        self.r
    }
    /// The row's indices (i1, i2, i3).
    #[inline(always)]
    pub(crate) fn i(&self) -> (usize, usize, usize) {
        self.i
    }
}

/// The rows of a [`DstRows`], counted up without divisions.
pub(crate) struct RowIter {
    r: usize,
    end: usize,
    i: [usize; 3],
    ne: [usize; 2],
}

impl Iterator for RowIter {
    type Item = RowIdx;
    #[inline(always)]
    fn next(&mut self) -> Option<RowIdx> {
        if self.r >= self.end {
            return None;
        }
        let out = RowIdx { r: self.r, i: (self.i[0], self.i[1], self.i[2]) };
        self.r += 1;
        self.i[0] += 1;
        if self.i[0] == self.ne[0] {
            self.i[0] = 0;
            self.i[1] += 1;
            if self.i[1] == self.ne[1] {
                self.i[1] = 0;
                self.i[2] += 1;
            }
        }
        Some(out)
    }
}

/// A destination row named by its flat index or by a [`RowIdx`].
pub(crate) trait AsRow: Copy {
    /// The flat index and the (i1, i2, i3) of the row in a tensor of shape `ne`.
    fn locate(self, ne: &[usize; 4]) -> (usize, (usize, usize, usize));
}

impl AsRow for usize {
    #[inline(always)]
    fn locate(self, ne: &[usize; 4]) -> (usize, (usize, usize, usize)) {
        (self, super::unravel_row(self, ne))
    }
}

impl AsRow for RowIdx {
    #[inline(always)]
    fn locate(self, _: &[usize; 4]) -> (usize, (usize, usize, usize)) {
        (self.r, self.i)
    }
}

/// A read-only strided row of a source the node does not write.
pub(crate) struct Row<'a, T> {
    p: *const T,
    n: usize,
    stride: usize,
    _t: PhantomData<&'a [T]>,
}

impl<'a, T: Elem> Row<'a, T> {
    /// Row (i1, i2, i3) of `t`.
    #[inline(always)]
    pub(crate) fn new(t: &'a TView, i1: usize, i2: usize, i3: usize) -> Self {
        assert!(!t.written, "a written tensor is read through its destination rows");
        let n = t.ne[0];
        let p = if n == 0 { t.ptr as *const T } else { t.elem_ptr::<T>(0, i1, i2, i3) };
        Row { p, n, stride: elem_stride::<T>(t), _t: PhantomData }
    }
    /// Element `i`.
    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> T {
        assert!(i < self.n);
        // SAFETY: element i of the row is in bounds (i < ne[0], the stride is nb[0] in
        // elements) and aligned (aligned start, aligned stride); the tensor is not written.
        unsafe { self.p.add(i * self.stride).read() }
    }
    /// The row as a slice when it is contiguous.
    #[inline(always)]
    pub(crate) fn as_slice(&self) -> Option<&'a [T]> {
        // SAFETY: contiguous rows of n elements from an aligned in-bounds start; not written.
        (self.stride == 1).then(|| unsafe { std::slice::from_raw_parts(self.p, self.n) })
    }
}

/// One destination row, lent by [`DstRows`]: strided or contiguous, written only by this worker.
pub(crate) struct Out<'a, T> {
    p: *mut T,
    n: usize,
    stride: usize,
    _t: PhantomData<&'a mut [T]>,
}

impl<'a, T: Elem> Out<'a, T> {
    #[inline(always)]
    fn new(d: &'a TView, i1: usize, i2: usize, i3: usize) -> Self {
        let n = d.ne[0];
        let p = if n == 0 { d.ptr as *mut T } else { d.elem_ptr::<T>(0, i1, i2, i3) };
        Out { p, n, stride: elem_stride::<T>(d), _t: PhantomData }
    }
    /// Elements in the row.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.n
    }
    /// True when the row's elements are adjacent.
    #[inline(always)]
    pub(crate) fn is_contiguous(&self) -> bool {
        self.stride == 1
    }
    /// Element `i`.
    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> T {
        assert!(i < self.n);
        // SAFETY: in bounds and aligned as in `Row::get`; the row is this worker's.
        unsafe { self.p.add(i * self.stride).read() }
    }
    /// Sets element `i`.
    #[inline(always)]
    pub(crate) fn set(&mut self, i: usize, v: T) {
        assert!(i < self.n);
        // SAFETY: in bounds and aligned as in `Row::get`; the row is this worker's alone
        // (`DstRows`), and `&mut self` excludes any other access through this `Out`.
        unsafe { self.p.add(i * self.stride).write(v) }
    }
    /// The row as `&mut [T]` (it must be contiguous).
    #[inline(always)]
    pub(crate) fn into_slice(self) -> &'a mut [T] {
        assert!(self.is_contiguous(), "strided destination row");
        // SAFETY: n contiguous elements from an aligned in-bounds start; the row belongs to this
        // worker alone and `self` is consumed, so this is the only reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.p, self.n) }
    }
    /// The row's start for kernels that take pointers (contiguous rows only).
    #[inline(always)]
    pub(crate) fn as_mut_ptr(&mut self) -> *mut T {
        assert!(self.is_contiguous(), "strided destination row");
        self.p
    }
}

/// Contiguous rows of an [`InOut`].
pub(crate) enum Slices<'a, T> {
    /// In place: the row read and written.
    Same(&'a mut [T]),
    /// The source row and the destination row.
    Two(&'a [T], &'a mut [T]),
}

/// A destination row and the same row of a same-shaped source, which may be the destination's
/// own memory (in place): then only the destination row exists, and reading "the source" reads
/// it before it is overwritten.
pub(crate) enum InOut<'a, T> {
    /// In place: the source row is the destination row.
    Same(Out<'a, T>),
    /// A separate source row.
    Two(Row<'a, T>, Out<'a, T>),
}

impl<'a, T: Elem> InOut<'a, T> {
    /// dst[i] = f(src[i]) for every element, each read before it is written.
    #[inline(always)]
    pub(crate) fn map(self, f: impl Fn(T) -> T) {
        match self {
            InOut::Same(o) if o.is_contiguous() => {
                o.into_slice().iter_mut().for_each(|x| *x = f(*x))
            }
            InOut::Same(mut o) => (0..o.len()).for_each(|i| o.set(i, f(o.get(i)))),
            InOut::Two(s, o) => match (s.as_slice(), o.is_contiguous()) {
                (Some(s), true) => o.into_slice().iter_mut().zip(s).for_each(|(y, &x)| *y = f(x)),
                (_, _) => {
                    let mut o = o;
                    (0..o.len()).for_each(|i| o.set(i, f(s.get(i))))
                }
            },
        }
    }

    /// Source element `i` (the destination's element `i` before it is written, in place).
    #[inline(always)]
    pub(crate) fn src(&self, i: usize) -> T {
        match self {
            InOut::Same(o) => o.get(i),
            InOut::Two(s, _) => s.get(i),
        }
    }

    /// Destination element `i` (what was last set, or the source's value in place).
    #[inline(always)]
    pub(crate) fn dst(&self, i: usize) -> T {
        match self {
            InOut::Same(o) | InOut::Two(_, o) => o.get(i),
        }
    }

    /// Sets destination element `i`.
    #[inline(always)]
    pub(crate) fn set(&mut self, i: usize, v: T) {
        match self {
            InOut::Same(o) | InOut::Two(_, o) => o.set(i, v),
        }
    }

    /// Elements in the row.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        match self {
            InOut::Same(o) | InOut::Two(_, o) => o.len(),
        }
    }

    /// Both rows as slices when they are contiguous: the destination alone in place, else the
    /// source and the destination.
    #[inline(always)]
    pub(crate) fn slices(self) -> Result<Slices<'a, T>, Self> {
        match self {
            InOut::Same(o) if o.is_contiguous() => Ok(Slices::Same(o.into_slice())),
            InOut::Two(s, o) if o.is_contiguous() && s.as_slice().is_some() => {
                Ok(Slices::Two(s.as_slice().unwrap_or_default(), o.into_slice()))
            }
            io => Err(io),
        }
    }
}

/// One node to run, with everything resolved at plan time.
pub(crate) struct ExecNode {
    pub id: TensorId,
    pub op: Op,
    pub dst: TView,
    pub src: [Option<TView>; MAX_SRC],
    pub phases: u8,
}

impl ExecNode {
    /// A placeholder naming the node in compute-time errors; `Plan::compute` replaces it with the
    /// full description (formatting it for every node at plan time would cost more than planning).
    pub(crate) fn label(&self) -> String {
        format!("#{}", self.id.idx)
    }
}

// SAFETY: the raw pointers inside point into the plan's arena and into buffers the plan keeps alive;
// workers only write disjoint parts of a node's destination (see exec.rs).
unsafe impl Send for ExecNode {}
// SAFETY: as above.
unsafe impl Sync for ExecNode {}
