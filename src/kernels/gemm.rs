//! Portable register-tile matmul kernels (the scalar twin of `x86/avx2_gemm.rs`). Needs no CPU
//! feature.
//!
//! A tile kernel computes `out[c * x.len() + r] = vec_dot(k, x[r], y[c])` for up to
//! [`GEMM_MR`](super::GEMM_MR) weight rows and [`GEMM_NR`](super::GEMM_NR) converted activation
//! rows. Each output is the tier's own `vec_dot` reduction, so a tile's results do not depend on the
//! tile shape, on how tiles are handed to threads, or on whether `mul_mat` uses tiles at all. This
//! tier has no loads to share and simply runs the scalar `vec_dot` per element.

#![allow(non_snake_case)]

use crate::quant::VecDotFn;
use crate::quant::legacy::{vec_dot_q4_0_q8_0, vec_dot_q8_0_q8_0};

#[inline(always)]
fn tile_by_vec_dot(dot: VecDotFn, k: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    let rows = x.len();
    for (c, yc) in y.iter().enumerate() {
        for (r, xr) in x.iter().enumerate() {
            out[c * rows + r] = dot(k, xr, yc);
        }
    }
}

/// Q4_0 weights against Q8_0 activations, one scalar `vec_dot_q4_0_q8_0` per output.
pub(crate) fn gemm_q4_0_q8_0(k: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    tile_by_vec_dot(vec_dot_q4_0_q8_0, k, x, y, out);
}

/// Q8_0 weights against Q8_0 activations, one scalar `vec_dot_q8_0_q8_0` per output.
pub(crate) fn gemm_q8_0_q8_0(k: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    tile_by_vec_dot(vec_dot_q8_0_q8_0, k, x, y, out);
}
