//! The scale searches shared by the K-quants (and available to the IQ formats): ggml's
//! `make_qx_quants`, `make_q3_quants`, `make_qkx2_quants`, `make_qkx3_quants`, `make_qp_quants`
//! and `get_scale_min_k4` (src/ggml-quants.c).
//!
//! Every function repeats ggml's float operations in ggml's order, with its `MIN`/`MAX` macro
//! semantics (`MAX(a, b) = a > b ? a : b`), its `nearest_int`, and C's integer-to-`int8_t`/`uint8_t`
//! truncations, so NaN and infinite inputs take the same path as in ggml. Nothing indexes memory
//! with a value derived from the data. The group size `n` of ggml's signature is the length of `x`.

use crate::quant::util::nearest_int;

/// ggml's `GROUP_MAX_EPS`: groups whose largest magnitude is below this quantize to zero.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `MAX` macro on ints.
#[inline(always)]
pub(crate) fn imax(a: i32, b: i32) -> i32 {
    if a > b { a } else { b }
}

/// ggml's `MIN` macro on ints.
#[inline(always)]
pub(crate) fn imin(a: i32, b: i32) -> i32 {
    if a < b { a } else { b }
}

/// ggml's `MAX` macro on floats: returns `b` when the comparison is false (so NaN in `b` wins).
#[inline(always)]
pub(crate) fn fmax_c(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// `MAX(lo, MIN(hi, l))`.
#[inline(always)]
pub(crate) fn clamp_c(l: i32, lo: i32, hi: i32) -> i32 {
    imax(lo, imin(hi, l))
}

/// The weight `make_qx_quants` gives element `x` when no importance weights are passed.
#[inline(always)]
fn qx_weight(rmse_type: i32, x: f32) -> f32 {
    match rmse_type {
        1 => x * x,
        2 => 1.0,
        3 => x.abs(),
        _ => x.abs().sqrt(),
    }
}

/// The value with the largest magnitude (`max`) and that magnitude (`amax`); the first wins ties.
#[inline(always)]
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (max, amax)
}

/// ggml's `make_qx_quants`: symmetric quantization of `x` to `L[i] in 0..2*nmax` (stored offset by
/// `nmax`), returning the scale. `rmse_type` 0 rounds once; otherwise the scale is refined for the
/// weighted error (weights `qw`, or `x^2`, 1, `|x|`, `sqrt|x|` for `rmse_type` 1, 2, 3, 4); a
/// negative `rmse_type` stops after the first refinement.
pub(crate) fn make_qx_quants(
    nmax: i32,
    x: &[f32],
    l_out: &mut [i8],
    mut rmse_type: i32,
    qw: Option<&[f32]>,
) -> f32 {
    let n = x.len();
    debug_assert!(l_out.len() >= n && qw.is_none_or(|w| w.len() >= n));
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    if rmse_type == 0 {
        for (l_i, &xi) in l_out.iter_mut().zip(x) {
            let l = nearest_int(iscale * xi);
            *l_i = (nmax + clamp_c(l, -nmax, nmax - 1)) as i8;
        }
        return 1.0 / iscale;
    }
    let mut return_early = false;
    if rmse_type < 0 {
        rmse_type = -rmse_type;
        return_early = true;
    }
    let weight = |i: usize| match qw {
        Some(w) => w[i],
        None => qx_weight(rmse_type, x[i]),
    };
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = clamp_c(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
        let w = weight(i);
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 { 0.5 * (scale + 1.0 / iscale) } else { 1.0 / iscale };
    }
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for (i, &xi) in x.iter().enumerate() {
            let l = clamp_c(nearest_int(iscale * xi), -nmax, nmax - 1);
            let w = weight(i);
            let lf = l as f32;
            sumlx += w * xi * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (l_i, &xi) in l_out.iter_mut().zip(x) {
                let l = nearest_int(iscale * xi);
                *l_i = (nmax + clamp_c(l, -nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants`: symmetric quantization to `L[i] in 0..2*nmax` (offset by `nmax`);
/// with `do_rmse` the levels are refined one at a time for the `x^2`-weighted error.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8], do_rmse: bool) -> f32 {
    let n = x.len();
    debug_assert!(l_out.len() >= n);
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    if do_rmse {
        let mut sumlx = 0.0f32;
        let mut suml2 = 0.0f32;
        for i in 0..n {
            let l = clamp_c(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            l_out[i] = l as i8;
            let w = x[i] * x[i];
            let lf = l as f32;
            sumlx += w * x[i] * lf;
            suml2 += w * lf * lf;
        }
        for _itry in 0..5 {
            let mut n_changed = 0;
            for i in 0..n {
                let w = x[i] * x[i];
                let li = l_out[i] as f32;
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = clamp_c(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                    if new_l != l_out[i] as i32 {
                        let nl = new_l as f32;
                        slx += w * x[i] * nl;
                        sl2 += w * nl * nl;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            l_out[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for l in &mut l_out[..n] {
            *l = l.wrapping_add(nmax as i8);
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for (l_i, &xi) in l_out.iter_mut().zip(x) {
        let l = clamp_c(nearest_int(iscale * xi), -nmax, nmax - 1);
        *l_i = (l + nmax) as i8;
    }
    1.0 / iscale
}

/// Result of an asymmetric (scale and min) search: `x[i] ~ scale * L[i] - min`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ScaleMin {
    pub scale: f32,
    /// ggml's `*the_min`: the negated offset, so non-negative for groups that contain a value <= 0.
    pub min: f32,
}

/// ggml's `make_qkx2_quants`: levels `L[i] in 0..=nmax` with a scale and a min, searched over
/// `nstep + 1` candidate scales for the weighted squared (or absolute, `use_mad`) error. `l_aux`
/// is scratch of at least `x.len()` entries.
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    l_aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> ScaleMin {
    make_qkx_quants(nmax, x, Some(weights), l_out, l_aux, rmin, rdelta, nstep, use_mad, 2)
}

/// ggml's `make_qkx3_quants`: as [`make_qkx2_quants`] but `weights == None` means `x[i]^2`
/// (ggml's `NULL`), and a group with `max <= min` (not only `==`) quantizes to zero.
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx3_quants(
    nmax: i32,
    x: &[f32],
    weights: Option<&[f32]>,
    l_out: &mut [u8],
    l_aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> ScaleMin {
    make_qkx_quants(nmax, x, weights, l_out, l_aux, rmin, rdelta, nstep, use_mad, 3)
}

/// The body shared by `make_qkx2_quants` and `make_qkx3_quants`; they differ only in the weight
/// source and in the degenerate-group test (`max == min` vs `max <= min`, which differ for NaN).
#[allow(clippy::too_many_arguments)]
fn make_qkx_quants(
    nmax: i32,
    x: &[f32],
    weights: Option<&[f32]>,
    l_out: &mut [u8],
    l_aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
    variant: u8,
) -> ScaleMin {
    let n = x.len();
    debug_assert!(n > 0 && l_out.len() >= n && l_aux.len() >= n);
    let w_at = |i: usize| match weights {
        Some(w) => w[i],
        None => x[i] * x[i],
    };
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = w_at(0);
    let mut sum_x = sum_w * x[0];
    for (i, &xi) in x.iter().enumerate().skip(1) {
        if xi < min {
            min = xi;
        }
        if xi > max {
            max = xi;
        }
        let w = w_at(i);
        sum_w += w;
        sum_x += w * xi;
    }
    if min > 0.0 {
        min = 0.0;
    }
    #[allow(clippy::float_cmp)]
    let degenerate = if variant == 2 { max == min } else { max <= min };
    if degenerate {
        l_out[..n].fill(0);
        return ScaleMin { scale: 0.0, min: -min };
    }
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        l_out[i] = clamp_c(l, 0, nmax) as u8;
        let diff = scale * l_out[i] as f32 + min - x[i];
        best_error += w_at(i) * err(diff);
    }
    if nstep < 1 {
        return ScaleMin { scale, min: -min };
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for i in 0..n {
            let l = clamp_c(nearest_int(iscale * (x[i] - min)), 0, nmax);
            l_aux[i] = l as u8;
            let w = w_at(i);
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * l_aux[i] as f32 + this_min - x[i];
                cur_error += w_at(i) * err(diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&l_aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    ScaleMin { scale, min: -min }
}

/// ggml's `make_qp_quants`: quantizes non-negative values (scales or mins of sub-blocks) to
/// `L[i] in 0..=nmax` with one scale, minimising the `quant_weights`-weighted squared error.
/// `L` is `uint8_t` in ggml, and so are the truncations here.
pub(crate) fn make_qp_quants(nmax: i32, x: &[f32], l_out: &mut [u8], quant_weights: &[f32]) -> f32 {
    let n = x.len();
    debug_assert!(l_out.len() >= n && quant_weights.len() >= n);
    let mut max = 0.0f32;
    for &v in x {
        max = fmax_c(max, v);
    }
    // `max < eps` is false for NaN; ggml goes on with a NaN scale, and so do we.
    if max < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for (l_i, &xi) in l_out.iter_mut().zip(x) {
        *l_i = nearest_int(iscale * xi) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..n {
        let diff = x[i] - scale * l_out[i] as f32;
        best_mse += quant_weights[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for i in 0..n {
            let l = imin(nmax, nearest_int(iscale_is * x[i]));
            let diff = x[i] - scale_is * l as f32;
            mse += quant_weights[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = imin(nmax, nearest_int(iscale * x[i]));
        l_out[i] = l as u8;
        let w = quant_weights[i];
        // ggml accumulates with `l` (an int), not with the truncated `L[i]`.
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    for _itry in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = quant_weights[i];
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = imin(nmax, nearest_int(x[i] * sl2 / slx));
                if new_l != l_out[i] as i32 {
                    let nl = new_l as f32;
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) from the 12 packed
/// bytes of a Q4_K/Q5_K block.
#[inline(always)]
pub(crate) fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn make_qx_quants_all_zero_gives_zero_scale() {
        let mut l = [5i8; 16];
        assert_eq!(make_qx_quants(4, &[0.0; 16], &mut l, 1, None), 0.0);
        assert_eq!(l, [0; 16]);
    }

    #[test]
    fn make_qx_quants_rounds_symmetric_values() {
        let x: Vec<f32> = (0..16).map(|i| i as f32 - 8.0).collect();
        let mut l = [0i8; 16];
        let d = make_qx_quants(8, &x, &mut l, 0, None);
        for (xi, li) in x.iter().zip(l) {
            assert!((d * (li as f32 - 8.0) - xi).abs() < 1e-5);
        }
    }

    #[test]
    fn make_qkx2_quants_reconstructs_affine_data() {
        let x: Vec<f32> = (0..32).map(|i| 0.25 * (i % 16) as f32 - 1.0).collect();
        let w = [1.0f32; 32];
        let (mut l, mut aux) = ([0u8; 32], [0u8; 32]);
        let sm = make_qkx2_quants(15, &x, &w, &mut l, &mut aux, -1.0, 0.1, 20, false);
        for (xi, li) in x.iter().zip(l) {
            assert!((sm.scale * li as f32 - sm.min - xi).abs() < 1e-4, "{sm:?}");
        }
    }

    #[test]
    fn make_qp_quants_handles_nan_without_panicking() {
        let mut l = [0u8; 8];
        let x = [0.5, f32::NAN, 1.0, 0.0, 2.0, 0.1, 0.2, 0.3];
        let _ = make_qp_quants(63, &x, &mut l, &[1.0; 8]);
    }

    #[test]
    fn get_scale_min_k4_unpacks_high_bits() {
        let mut q = [0u8; 12];
        q[0] = 0b1100_0001; // scale 0 = 1, high bits of scale 4 = 3
        q[4] = 0b0100_0010; // min 0 = 2, high bits of min 4 = 1
        q[8] = 0x5A; // scale 4 low = 0xA, min 4 low = 0x5
        assert_eq!(get_scale_min_k4(0, &q), (1, 2));
        assert_eq!(get_scale_min_k4(4, &q), (0x3A, 0x15));
    }
}
