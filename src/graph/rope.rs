//! Rotary position embeddings: `rope_ext` and `rope_multi` (ggml_rope_ext / ggml_rope_multi), with
//! ggml's modes and YaRN parameters, validated at build time.

use super::{Graph, Op, TensorId};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// How dimensions are paired for rotation (ggml's `GGML_ROPE_TYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RopeMode {
    /// Adjacent pairs (x0, x1), (x2, x3), ... (`GGML_ROPE_TYPE_NORMAL`, 0).
    Normal,
    /// Halves: (x_i, x_{i + n_dims/2}) (`GGML_ROPE_TYPE_NEOX`, 2).
    Neox,
    /// Multi-section rope with 4 position ids per token (`GGML_ROPE_TYPE_MROPE`, 8).
    Mrope,
    /// Vision rope: sections rotated independently over all dims (`GGML_ROPE_TYPE_VISION`, 24).
    Vision,
    /// Interleaved multi-section rope (`GGML_ROPE_TYPE_IMROPE`, 40).
    Imrope,
}

impl RopeMode {
    /// The mode for ggml's integer `mode`, or `None` for values ggml does not define.
    pub fn from_ggml(mode: i32) -> Option<RopeMode> {
        Some(match mode {
            0 => RopeMode::Normal,
            2 => RopeMode::Neox,
            8 => RopeMode::Mrope,
            24 => RopeMode::Vision,
            40 => RopeMode::Imrope,
            _ => return None,
        })
    }

    /// ggml's integer value.
    pub fn ggml(self) -> i32 {
        match self {
            RopeMode::Normal => 0,
            RopeMode::Neox => 2,
            RopeMode::Mrope => 8,
            RopeMode::Vision => 24,
            RopeMode::Imrope => 40,
        }
    }

    /// True for the modes that take 4 position ids per token (ggml's `mode & GGML_ROPE_TYPE_MROPE`).
    pub fn is_multi(self) -> bool {
        matches!(self, RopeMode::Mrope | RopeMode::Vision | RopeMode::Imrope)
    }
}

/// Parameters of a rope node (ggml's op_params for GGML_OP_ROPE).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Number of leading dims rotated (even, <= ne\[0\]).
    pub n_dims: usize,
    /// Pairing mode.
    pub mode: RopeMode,
    /// Training context length (for YaRN's correction dims).
    pub n_ctx_orig: i32,
    /// Base of the geometric frequency progression (10000 for llama).
    pub freq_base: f32,
    /// Position interpolation factor (1 = off).
    pub freq_scale: f32,
    /// YaRN extrapolation mix (0 = off).
    pub ext_factor: f32,
    /// Magnitude scale of sin/cos (1 = off).
    pub attn_factor: f32,
    /// YaRN low correction dim.
    pub beta_fast: f32,
    /// YaRN high correction dim.
    pub beta_slow: f32,
    /// Sections for the multi modes (t, h, w, e).
    pub sections: [i32; 4],
    /// First rotated dim (ggml_rope_set_offset): dims `n_offs .. n_offs + n_dims` are rotated,
    /// the others copied. Even, 0 by default, not with the vision mode.
    pub n_offs: usize,
}

impl RopeParams {
    /// Plain rope with llama's defaults: no YaRN, `freq_scale` 1, `attn_factor` 1.
    pub fn new(n_dims: usize, mode: RopeMode, freq_base: f32) -> RopeParams {
        RopeParams {
            n_dims,
            mode,
            n_ctx_orig: 0,
            freq_base,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            sections: [0; 4],
            n_offs: 0,
        }
    }
}

/// The offset rule (ggml_rope_set_offset's and the CPU kernel's asserts) for rows of `ne0`.
fn check_offset(op: &'static str, p: &RopeParams, ne0: usize) -> Result<()> {
    let fits = p.n_offs.checked_add(p.n_dims).is_some_and(|e| e <= ne0);
    if !p.n_offs.is_multiple_of(2) || !fits || (p.mode == RopeMode::Vision && p.n_offs != 0) {
        return Err(Error::param(
            op,
            format!(
                "n_offs = {} must be even, with n_offs + n_dims ({}) <= head size {}, and 0 in \
                 vision mode",
                p.n_offs, p.n_dims, ne0
            ),
        ));
    }
    Ok(())
}

impl Graph {
    /// ggml_rope_ext: rotates pairs of the first `p.n_dims` dims of `a` ([head_dim, n_head, n_tokens,
    /// batch], F32 or F16) by angles from the I32 positions `pos` (one per token; four per token
    /// for the multi modes). `freq_factors` (F32, >= n_dims/2 values) divides each frequency.
    pub fn rope_ext(
        &mut self,
        a: TensorId,
        pos: TensorId,
        freq_factors: Option<TensorId>,
        p: RopeParams,
    ) -> Result<TensorId> {
        const OP: &str = "rope";
        let ta = self.get(OP, a)?;
        let tp = self.get(OP, pos)?;
        if !matches!(ta.dtype, DType::F32 | DType::F16) {
            return Err(Error::ty(OP, format!("{} must be F32 or F16", ta.describe(a))));
        }
        if !ta.rows_contiguous() {
            return Err(Error::shape(OP, format!("rows of {} are not contiguous", ta.describe(a))));
        }
        if tp.dtype != DType::I32 || tp.ne[1] * tp.ne[2] * tp.ne[3] != 1 {
            return Err(Error::ty(
                OP,
                format!("positions {} must be an I32 vector", tp.describe(pos)),
            ));
        }
        let want = if p.mode.is_multi() { 4 * ta.ne[2] } else { ta.ne[2] };
        if tp.ne[0] != want {
            return Err(Error::shape(
                OP,
                format!(
                    "positions {} must have {want} entries for {}",
                    tp.describe(pos),
                    ta.describe(a)
                ),
            ));
        }
        if p.n_dims == 0 || !p.n_dims.is_multiple_of(2) || p.n_dims > ta.ne[0] {
            return Err(Error::param(
                OP,
                format!("n_dims = {} must be even, > 0 and <= head size {}", p.n_dims, ta.ne[0]),
            ));
        }
        check_offset(OP, &p, ta.ne[0])?;
        if p.mode == RopeMode::Vision && p.n_dims != ta.ne[0] / 2 {
            return Err(Error::param(
                OP,
                format!("vision mode needs n_dims == ne[0]/2 = {}", ta.ne[0] / 2),
            ));
        }
        if p.mode.is_multi() {
            if p.sections.iter().any(|&s| s < 0) || p.sections[..3].iter().all(|&s| s == 0) {
                return Err(Error::param(
                    OP,
                    format!("sections {:?} must be >= 0 and not all zero", p.sections),
                ));
            }
            let sum: i64 = p.sections.iter().map(|&s| s as i64).sum();
            if sum as usize > ta.ne[0] {
                return Err(Error::param(
                    OP,
                    format!("sections {:?} exceed head size {}", p.sections, ta.ne[0]),
                ));
            }
        }
        for (name, v) in [
            ("freq_base", p.freq_base),
            ("freq_scale", p.freq_scale),
            ("ext_factor", p.ext_factor),
            ("attn_factor", p.attn_factor),
            ("beta_fast", p.beta_fast),
            ("beta_slow", p.beta_slow),
        ] {
            if !v.is_finite() {
                return Err(Error::param(OP, format!("{name} = {v} is not finite")));
            }
        }
        if p.freq_base <= 0.0 || p.freq_scale <= 0.0 {
            return Err(Error::param(OP, "freq_base and freq_scale must be > 0"));
        }
        let mut srcs = vec![a, pos];
        if let Some(f) = freq_factors {
            let tf = self.get(OP, f)?;
            if tf.dtype != DType::F32 || tf.ne[0] < p.n_dims / 2 || !tf.rows_contiguous() {
                return Err(Error::shape(
                    OP,
                    format!(
                        "freq_factors {} must be F32 with >= {} values",
                        tf.describe(f),
                        p.n_dims / 2
                    ),
                ));
            }
            srcs.push(f);
        }
        let (dt, ne) = (ta.dtype, ta.ne);
        self.node(Op::Rope(Box::new(p)), dt, ne, &srcs)
    }

    /// ggml_rope_multi: `rope_ext` for the multi-section modes (Mrope, Vision, Imrope) with
    /// `sections`.
    pub fn rope_multi(
        &mut self,
        a: TensorId,
        pos: TensorId,
        freq_factors: Option<TensorId>,
        sections: [i32; 4],
        p: RopeParams,
    ) -> Result<TensorId> {
        if !p.mode.is_multi() {
            return Err(Error::param(
                "rope_multi",
                format!("mode {:?} is not a multi-section mode", p.mode),
            ));
        }
        self.rope_ext(a, pos, freq_factors, RopeParams { sections, ..p })
    }
}

impl Graph {
    /// ggml_rope_set_offset: rotates dims `n_offs .. n_offs + n_dims` of a `rope` or `rope_back`
    /// node's rows instead of the first `n_dims` (the others are copied). `n_offs` is even and
    /// fits the head size; the vision mode takes none.
    pub fn rope_set_offset(&mut self, node: TensorId, n_offs: usize) -> Result<()> {
        const OP: &str = "rope_set_offset";
        let t = self.get(OP, node)?;
        let mut p = match &t.op {
            Op::Rope(p) | Op::RopeBack(p) => **p,
            op => {
                return Err(Error::arg(format!(
                    "{OP}: {} is a {} node, not rope or rope_back",
                    t.describe(node),
                    op.name()
                )));
            }
        };
        let ne0 = t.ne[0];
        p.n_offs = n_offs;
        check_offset(OP, &p, ne0)?;
        let i = self.index_of(node).expect("checked by get");
        self.tensors[i].op = match &self.tensors[i].op {
            Op::Rope(_) => Op::Rope(Box::new(p)),
            _ => Op::RopeBack(Box::new(p)),
        };
        Ok(())
    }
}
