//! Data-movement builders beyond views and copies: set_rows.

use super::{Graph, Leaf, MAX_SRC, Op, Tensor, TensorId};
use crate::dtype::DType;
use crate::error::{Error, Result};

impl Graph {
    /// Writes the rows of `b` (F32 or F16) into the rows of `a` picked by `ids` (I32 or I64),
    /// converting to `a`'s type with ggml's CPU `from_float` (ggml_set_rows): `a[ids[i]] = b[i]`.
    /// `a` is [n, rows, p, q], `b` [n, k, p, q], `ids` [k, p', q'] with p' dividing p and q'
    /// dividing q. The result is a view of `a` (for a KV cache, `a` is a view of a state tensor).
    /// Out-of-range ids make compute return `Err`; with repeated ids the last row wins.
    pub fn set_rows(&mut self, a: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        const OP: &str = "set_rows";
        let (ta, tb, ti) = (self.get(OP, a)?, self.get(OP, b)?, self.get(OP, ids)?);
        if !matches!(ti.dtype, DType::I32 | DType::I64) {
            return Err(Error::ty(OP, format!("ids {} must be I32 or I64", ti.describe(ids))));
        }
        if !matches!(tb.dtype, DType::F32 | DType::F16) {
            return Err(Error::ty(OP, format!("b {} must be F32 or F16", tb.describe(b))));
        }
        let f = crate::quant::format(ta.dtype);
        let writable = matches!(ta.dtype, DType::F32 | DType::F16 | DType::BF16)
            || f.from_float.is_some()
            || (f.quantize.is_some() && !f.requires_imatrix);
        if !writable {
            return Err(Error::ty(OP, format!("cannot convert rows to {}", ta.describe(a))));
        }
        if ta.ne[0] != tb.ne[0]
            || ta.ne[2] != tb.ne[2]
            || ta.ne[3] != tb.ne[3]
            || tb.ne[1] != ti.ne[0]
            || !super::divides(ti.ne[1], tb.ne[2])
            || !super::divides(ti.ne[2], tb.ne[3])
            || ti.ne[3] != 1
        {
            return Err(Error::shape(
                OP,
                format!(
                    "a {}, b {}, ids {}: need equal ne[0], ne[2], ne[3] for a and b, ids.ne[0] == b.ne[1], ids dims 1, 2 dividing b's, ids.ne[3] == 1",
                    ta.describe(a),
                    tb.describe(b),
                    ti.describe(ids)
                ),
            ));
        }
        if !ta.rows_contiguous() || !tb.rows_contiguous() {
            return Err(Error::shape(OP, "rows of a and b must be contiguous"));
        }
        super::check_no_self_overlap(OP, ta, a)?;
        self.check_apart(OP, a, b, "rows")?;
        self.check_apart(OP, a, ids, "ids")?;
        if matches!(self.t(self.root(a)).leaf, Leaf::Weight { .. }) {
            return Err(Error::Buffer(format!(
                "set_rows: destination {} is a read-only weight",
                ta.describe(a)
            )));
        }
        let (dtype, ne, nb) = (ta.dtype, ta.ne, ta.nb);
        let root = self.root(a);
        let offs = if ta.view_src.is_some() { ta.view_offs } else { 0 };
        let mut src = [None; MAX_SRC];
        src[0] = Some(b);
        src[1] = Some(ids);
        src[2] = Some(a);
        self.push(Tensor {
            dtype,
            ne,
            nb,
            op: Op::SetRows,
            src,
            view_src: Some(root),
            view_offs: offs,
            leaf: Leaf::None,
            name: None,
            output: false,
        })
    }
}

/// How an output element of a gather-style op finds its source (see `ops::gather`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Gather {
    /// src0 then src1 along `dim` (ggml_concat).
    Concat {
        /// The dimension joined along, 0 (innermost, `ne[0]`) to 3.
        dim: usize,
    },
    /// src0 tiled to the output shape.
    Repeat,
    /// Zero (or wrapped, when `circular`) padding: `lp[d]` elements before dim d (ggml_pad_ext).
    Pad {
        /// Elements added before the start of each dim (ggml's `lp0..lp3`); the padding after
        /// the end follows from the output shape.
        lp: [usize; 4],
        /// Fill with the values from the opposite edge (ggml_pad_circular) instead of zeros;
        /// the padding on each side is then at most the dim's size.
        circular: bool,
    },
    /// Reflection padding of dim 0 by `p0` on the left (ggml_pad_reflect_1d).
    PadReflect1d {
        /// Elements mirrored in before element 0 (the edge element itself is not repeated);
        /// below `ne[0]`. The right padding follows from the output shape.
        p0: usize,
    },
    /// Circular shift by `shift[d]` along every dim (ggml_roll).
    Roll {
        /// Elements to shift each dim by, `|shift[d]| < ne[d]`: output `i` takes input
        /// `i - shift[d]` modulo `ne[d]`, so a positive shift moves elements toward higher indices.
        shift: [i64; 4],
    },
}

impl Graph {
    fn gather_node(
        &mut self,
        op: &'static str,
        g: Gather,
        srcs: &[TensorId],
        ne: [usize; 4],
    ) -> Result<TensorId> {
        let t = self.get(op, srcs[0])?;
        if t.dtype.block_size() != 1 {
            return Err(Error::ty(
                op,
                format!("{} is block-quantized; {op} copies single elements", t.describe(srcs[0])),
            ));
        }
        let dt = t.dtype;
        self.node(Op::Gather(g), dt, ne, srcs)
    }

    /// ggml_concat: `a` and `b` (same type, equal shapes except along `dim`) joined along `dim`.
    pub fn concat(&mut self, a: TensorId, b: TensorId, dim: usize) -> Result<TensorId> {
        let (ta, tb) = (self.get("concat", a)?, self.get("concat", b)?);
        if dim >= 4 || ta.dtype != tb.dtype || (0..4).any(|d| d != dim && ta.ne[d] != tb.ne[d]) {
            return Err(Error::shape(
                "concat",
                format!("cannot join {} and {} along dim {dim}", ta.describe(a), tb.describe(b)),
            ));
        }
        let mut ne = ta.ne;
        ne[dim] += tb.ne[dim];
        self.gather_node("concat", Gather::Concat { dim }, &[a, b], ne)
    }

    /// ggml_repeat_4d: `a` tiled to shape `ne` (every dim a multiple of `a`'s).
    pub fn repeat(&mut self, a: TensorId, ne: [usize; 4]) -> Result<TensorId> {
        let ta = self.get("repeat", a)?;
        if (0..4).any(|d| ta.ne[d] == 0 || !ne[d].is_multiple_of(ta.ne[d])) {
            return Err(Error::shape(
                "repeat",
                format!("{} cannot be tiled to {ne:?}", ta.describe(a)),
            ));
        }
        self.gather_node("repeat", Gather::Repeat, &[a], ne)
    }

    /// ggml_repeat: `a` tiled to the shape of `b`.
    pub fn repeat_like(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let ne = self.get("repeat", b)?.ne;
        self.repeat(a, ne)
    }

    /// ggml_pad_ext: `lp[d]` elements before and `rp[d]` after each dim, zeros (or wrapped values
    /// when `circular`, ggml_pad_circular).
    pub fn pad_ext(
        &mut self,
        a: TensorId,
        lp: [usize; 4],
        rp: [usize; 4],
        circular: bool,
    ) -> Result<TensorId> {
        let ta = self.get("pad", a)?;
        let mut ne = ta.ne;
        for d in 0..4 {
            ne[d] = ne[d]
                .checked_add(lp[d])
                .and_then(|v| v.checked_add(rp[d]))
                .ok_or(Error::Overflow { what: "pad" })?;
            if circular && (lp[d] > ta.ne[d] || rp[d] > ta.ne[d]) {
                return Err(Error::param(
                    "pad",
                    format!("circular padding {lp:?}/{rp:?} exceeds {}", ta.describe(a)),
                ));
            }
        }
        self.gather_node("pad", Gather::Pad { lp, circular }, &[a], ne)
    }

    /// ggml_pad: zeros after each dim.
    pub fn pad(&mut self, a: TensorId, rp: [usize; 4]) -> Result<TensorId> {
        self.pad_ext(a, [0; 4], rp, false)
    }

    /// ggml_pad_reflect_1d: reflect dim 0 by `p0` on the left and `p1` on the right
    /// (each < ne\[0\]); F32.
    pub fn pad_reflect_1d(&mut self, a: TensorId, p0: usize, p1: usize) -> Result<TensorId> {
        let ta = self.get("pad_reflect_1d", a)?;
        if ta.dtype != DType::F32 || p0 >= ta.ne[0] || p1 >= ta.ne[0] {
            return Err(Error::param(
                "pad_reflect_1d",
                format!("{} (F32) with padding {p0}, {p1}: each must be < ne[0]", ta.describe(a)),
            ));
        }
        let mut ne = ta.ne;
        ne[0] += p0 + p1;
        self.gather_node("pad_reflect_1d", Gather::PadReflect1d { p0 }, &[a], ne)
    }

    /// ggml_roll: circular shift along every dim (|shift\[d\]| < ne\[d\]).
    pub fn roll(&mut self, a: TensorId, shift: [i64; 4]) -> Result<TensorId> {
        let ta = self.get("roll", a)?;
        if (0..4).any(|d| shift[d].unsigned_abs() as usize >= ta.ne[d].max(1) && shift[d] != 0) {
            return Err(Error::param(
                "roll",
                format!("shifts {shift:?} must be smaller than {}", ta.describe(a)),
            ));
        }
        let ne = ta.ne;
        self.gather_node("roll", Gather::Roll { shift }, &[a], ne)
    }

    /// ggml_repeat_back: sums `a` over its tiles down to the shape of `b` (F32).
    pub fn repeat_back(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let (ta, tb) = (self.get("repeat_back", a)?, self.get("repeat_back", b)?);
        if ta.dtype != DType::F32 || (0..4).any(|d| tb.ne[d] == 0 || ta.ne[d] % tb.ne[d] != 0) {
            return Err(Error::shape(
                "repeat_back",
                format!("{} is not F32 tiles of {}", ta.describe(a), tb.describe(b)),
            ));
        }
        let ne = tb.ne;
        self.node(Op::RepeatBack, DType::F32, ne, &[a])
    }

    /// ggml_arange: F32 values start, start + step, ... below stop.
    pub fn arange(&mut self, start: f32, stop: f32, step: f32) -> Result<TensorId> {
        if !(start.is_finite() && stop.is_finite() && step.is_finite())
            || stop <= start
            || step <= 0.0
        {
            return Err(Error::param("arange", format!("start {start}, stop {stop}, step {step}")));
        }
        let steps = ((stop - start) / step).ceil() as usize;
        self.node(Op::Arange { start, step }, DType::F32, [steps, 1, 1, 1], &[])
    }

    /// ggml_timestep_embedding: F32 timesteps \[n\] -> \[dim, n\] of cos/sin features.
    pub fn timestep_embedding(
        &mut self,
        t: TensorId,
        dim: usize,
        max_period: i32,
    ) -> Result<TensorId> {
        let tt = self.get("timestep_embedding", t)?;
        if tt.dtype != DType::F32 || tt.nb[0] != 4 || dim == 0 || max_period <= 0 {
            return Err(Error::param(
                "timestep_embedding",
                format!("{} F32 vector, dim {dim}, max_period {max_period}", tt.describe(t)),
            ));
        }
        let n = tt.ne[0];
        self.node(Op::TimestepEmbedding { dim, max_period }, DType::F32, [dim, n, 1, 1], &[t])
    }
}

/// Interpolation used by `interpolate` (ggml's `GGML_SCALE_MODE_*` with its flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScaleMode {
    /// Nearest neighbour.
    Nearest,
    /// Bilinear over dims 0 and 1; `antialias` widens the filter when shrinking (PyTorch's).
    Bilinear {
        /// `GGML_SCALE_FLAG_ALIGN_CORNERS`: the corner pixels of input and output line up (scale
        /// `(out - 1) / (in - 1)`, no half-pixel offset), as PyTorch's `align_corners=True`.
        align_corners: bool,
        /// `GGML_SCALE_FLAG_ANTIALIAS`: when shrinking, the triangle filter is widened to the
        /// shrink factor so every input pixel contributes (PyTorch's `antialias=True`).
        antialias: bool,
    },
    /// Bicubic (alpha -0.75, as PyTorch) over dims 0 and 1.
    Bicubic {
        /// `GGML_SCALE_FLAG_ALIGN_CORNERS`, as for [`ScaleMode::Bilinear`].
        align_corners: bool,
    },
}

impl Graph {
    /// ggml_interpolate: resizes F32 `a` to shape `ne` (dims 2 and 3 by nearest index).
    pub fn interpolate(
        &mut self,
        a: TensorId,
        ne: [usize; 4],
        mode: ScaleMode,
    ) -> Result<TensorId> {
        let ta = self.get("upscale", a)?;
        if ta.dtype != DType::F32 || ne.contains(&0) || ta.ne.contains(&0) {
            return Err(Error::param(
                "upscale",
                format!("{} (F32, non-empty) to {ne:?}", ta.describe(a)),
            ));
        }
        self.node(Op::Upscale(mode), DType::F32, ne, &[a])
    }

    /// ggml_upscale: dims 0 and 1 multiplied by `factor` (> 1).
    pub fn upscale(&mut self, a: TensorId, factor: usize, mode: ScaleMode) -> Result<TensorId> {
        let ne = self.get("upscale", a)?.ne;
        if factor < 2 {
            return Err(Error::param("upscale", format!("scale factor {factor} must be > 1")));
        }
        let scaled =
            |n: usize| n.checked_mul(factor).ok_or(Error::Overflow { what: "upscale size" });
        self.interpolate(a, [scaled(ne[0])?, scaled(ne[1])?, ne[2], ne[3]], mode)
    }
}

impl Graph {
    /// ggml_set: a copy of `a` with `b` written into the view of it given by byte strides
    /// `nb1..nb3` and byte `offset` (ggml_set_1d/2d use a contiguous view). F32 or I32.
    pub fn set(
        &mut self,
        a: TensorId,
        b: TensorId,
        nb: [usize; 3],
        offset: usize,
    ) -> Result<TensorId> {
        const OP: &str = "set";
        let (ta, tb) = (self.get(OP, a)?, self.get(OP, b)?);
        if ta.dtype != tb.dtype
            || !matches!(ta.dtype, DType::F32 | DType::I32)
            || !ta.is_contiguous()
        {
            return Err(Error::ty(
                OP,
                format!(
                    "{} and {} must be contiguous F32 or I32 of one type",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        let view_nb = [ta.dtype.type_size(), nb[0], nb[1], nb[2]];
        let span = super::checked_nbytes(tb.dtype, &tb.ne, &view_nb)
            .ok_or(Error::Overflow { what: "set" })?;
        if offset.checked_add(span).is_none_or(|end| end > ta.nbytes())
            || !offset.is_multiple_of(ta.dtype.type_size())
        {
            return Err(Error::shape(
                OP,
                format!(
                    "{} at offset {offset} with strides {nb:?} does not fit in {}",
                    tb.describe(b),
                    ta.describe(a)
                ),
            ));
        }
        // The view's elements must be aligned like any view's.
        super::check_view_align(OP, tb.dtype, &tb.ne, &view_nb, offset)?;
        // Workers write disjoint rows of b; rows that land on the same bytes would race.
        super::check_disjoint_layout(OP, tb.dtype, &tb.ne, &view_nb, || {
            format!("view of {} for {}", ta.describe(a), tb.describe(b))
        })?;
        let (dt, ne) = (ta.dtype, ta.ne);
        self.node(Op::Set { nb, offset }, dt, ne, &[a, b])
    }

    /// ggml_set_1d: `b` written contiguously into a copy of `a` at byte `offset`.
    pub fn set_1d(&mut self, a: TensorId, b: TensorId, offset: usize) -> Result<TensorId> {
        let tb = self.get("set", b)?;
        let nb1 = tb.nb[1];
        self.set(a, b, [nb1, tb.nb[2], tb.nb[3]], offset)
    }
}
