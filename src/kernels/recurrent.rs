//! Inner loops of the recurrent ops (ssm_scan, rwkv_wkv6, gated_linear_attn, rwkv_wkv7): one
//! portable body per kernel, built once plainly (the scalar tier) and once with AVX2 + FMA enabled
//! (the AVX2 tier, x86-64 only) so that LLVM vectorises the same code with 256-bit FMAs.
//!
//! Both builds run the same operations in the same order (fused multiply-adds are written as
//! `mul_add`, which is exact in either build), so the tiers give bitwise-equal results. Reductions
//! use 16 lane accumulators combined in a fixed tree: the order never depends on the thread count.
//!
//! The portable set is [`PORTABLE`]; `x86/avx2_recurrent.rs` builds the same bodies for AVX2. A
//! tier's set is the `recurrent` entry of its `KernelTable`; no feature check runs inside a loop.

/// Mamba-2 state row: `s[i] = s[i] * da + b[i] * x_dt`, returns `sum_i s[i] * c[i]`.
pub(crate) type SsmScanRowFn = fn(s: &mut [f32], b: &[f32], c: &[f32], da: f32, x_dt: f32) -> f32;
/// RWKV-6 state row `i` of a head: for every `j`, `kv = v[j] * k`,
/// `out[j] += (kv * tf + s[j]) * r`, `s[j] = s[j] * td + kv`.
pub(crate) type Wkv6RowFn =
    fn(s: &mut [f32], out: &mut [f32], v: &[f32], k: f32, r: f32, tf: f32, td: f32);
/// Four consecutive RWKV-6 state rows `i..i+4` (`s` holds 4 rows of `out.len()`): the same
/// operations as four [`Wkv6RowFn`] calls in row order, with `out` and `v` loaded once per element.
pub(crate) type Wkv6Rows4Fn = fn(
    s: &mut [f32],
    out: &mut [f32],
    v: &[f32],
    k: [f32; 4],
    r: [f32; 4],
    tf: [f32; 4],
    td: [f32; 4],
);
/// Gated linear attention state row: `t = s[j] * g + v[j] * k`, `out[j] += t * q`, `s[j] = t`.
pub(crate) type GlaRowFn = fn(s: &mut [f32], out: &mut [f32], v: &[f32], k: f32, q: f32, g: f32);
/// RWKV-7 state row: `sa = sum_j a[j] s[j]`, `s[j] = s[j] w[j] + v k[j] + sa b[j]`, returns
/// `sum_j s[j] r[j]`; the rows are `[r, w, k, a, b]`.
pub(crate) type Wkv7RowFn = fn(s: &mut [f32], rwkab: [&[f32]; 5], v: f32) -> f32;

/// Function pointers for one tier (the `recurrent` entry of a `KernelTable`).
#[derive(Clone, Copy)]
pub(crate) struct RecurrentKernels {
    /// See [`SsmScanRowFn`].
    pub ssm_scan_row: SsmScanRowFn,
    /// See [`Wkv6RowFn`].
    pub wkv6_row: Wkv6RowFn,
    /// See [`Wkv6Rows4Fn`].
    pub wkv6_rows4: Wkv6Rows4Fn,
    /// See [`GlaRowFn`].
    pub gla_row: GlaRowFn,
    /// See [`Wkv7RowFn`].
    pub wkv7_row: Wkv7RowFn,
}

pub(crate) const LANES: usize = 16;

/// Combines 16 lane sums in a fixed pairwise tree.
#[inline(always)]
pub(crate) fn reduce16(acc: [f32; LANES]) -> f32 {
    let mut s8 = [0f32; 8];
    for l in 0..8 {
        s8[l] = acc[l] + acc[l + 8];
    }
    let mut s4 = [0f32; 4];
    for l in 0..4 {
        s4[l] = s8[l] + s8[l + 4];
    }
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

#[inline(always)]
pub(crate) fn ssm_scan_row_body(s: &mut [f32], b: &[f32], c: &[f32], da: f32, x_dt: f32) -> f32 {
    let n = s.len().min(b.len()).min(c.len());
    let (s, b, c) = (&mut s[..n], &b[..n], &c[..n]);
    let mut acc = [0f32; LANES];
    let full = n / LANES * LANES;
    for ((sc, bc), cc) in
        s[..full].chunks_exact_mut(LANES).zip(b.chunks_exact(LANES)).zip(c.chunks_exact(LANES))
    {
        for l in 0..LANES {
            // ggml: state = s0 * dA + B * x_dt (two products, one add), y += state * C (FMA).
            let st = sc[l] * da + bc[l] * x_dt;
            sc[l] = st;
            acc[l] = st.mul_add(cc[l], acc[l]);
        }
    }
    for i in full..n {
        let st = s[i] * da + b[i] * x_dt;
        s[i] = st;
        acc[i - full] = st.mul_add(c[i], acc[i - full]);
    }
    reduce16(acc)
}

#[inline(always)]
pub(crate) fn wkv6_row_body(
    s: &mut [f32],
    out: &mut [f32],
    v: &[f32],
    k: f32,
    r: f32,
    tf: f32,
    td: f32,
) {
    let n = s.len().min(out.len()).min(v.len());
    for ((sj, oj), &vj) in s[..n].iter_mut().zip(&mut out[..n]).zip(&v[..n]) {
        let kv = vj * k;
        let prev = *sj;
        let temp = kv.mul_add(tf, prev);
        *oj = temp.mul_add(r, *oj);
        *sj = prev.mul_add(td, kv);
    }
}

#[inline(always)]
pub(crate) fn wkv6_rows4_body(
    s: &mut [f32],
    out: &mut [f32],
    v: &[f32],
    k: [f32; 4],
    r: [f32; 4],
    tf: [f32; 4],
    td: [f32; 4],
) {
    let n = out.len().min(v.len()).min(s.len() / 4);
    let (s0, rest) = s.split_at_mut(n);
    let (s1, rest) = rest.split_at_mut(n);
    let (s2, rest) = rest.split_at_mut(n);
    let s3 = &mut rest[..n];
    let rows = s0.iter_mut().zip(s1.iter_mut()).zip(s2.iter_mut()).zip(s3.iter_mut());
    for ((((a, b), c), d), (oj, &vj)) in rows.zip(out[..n].iter_mut().zip(&v[..n])) {
        let mut o = *oj;
        for (q, sj) in [a, b, c, d].into_iter().enumerate() {
            let kv = vj * k[q];
            let prev = *sj;
            o = kv.mul_add(tf[q], prev).mul_add(r[q], o);
            *sj = prev.mul_add(td[q], kv);
        }
        *oj = o;
    }
}

#[inline(always)]
pub(crate) fn gla_row_body(s: &mut [f32], out: &mut [f32], v: &[f32], k: f32, q: f32, g: f32) {
    let n = s.len().min(out.len()).min(v.len());
    for ((sj, oj), &vj) in s[..n].iter_mut().zip(&mut out[..n]).zip(&v[..n]) {
        let kv = vj * k;
        let temp = sj.mul_add(g, kv);
        *oj = temp.mul_add(q, *oj);
        *sj = temp;
    }
}

#[inline(always)]
pub(crate) fn wkv7_row_body(s: &mut [f32], rwkab: [&[f32]; 5], v: f32) -> f32 {
    let [r, w, k, a, b] = rwkab;
    let n = s.len().min(r.len()).min(w.len()).min(k.len()).min(a.len()).min(b.len());
    let (s, r, w, k, a, b) = (&mut s[..n], &r[..n], &w[..n], &k[..n], &a[..n], &b[..n]);
    let full = n / LANES * LANES;
    // sa = a . s, lane l summing the elements l, l + 16, ... in order.
    let mut acc = [0f32; LANES];
    for (ac, sc) in a[..full].chunks_exact(LANES).zip(s[..full].chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] = ac[l].mul_add(sc[l], acc[l]);
        }
    }
    for i in full..n {
        acc[i - full] = a[i].mul_add(s[i], acc[i - full]);
    }
    let sa = reduce16(acc);
    // s = s * w + v k + sa b (ggml's two FMAs), y = s . r.
    let mut acc = [0f32; LANES];
    let rows = s[..full]
        .chunks_exact_mut(LANES)
        .zip(r.chunks_exact(LANES))
        .zip(w.chunks_exact(LANES))
        .zip(k.chunks_exact(LANES))
        .zip(b.chunks_exact(LANES));
    for ((((sc, rc), wc), kc), bc) in rows {
        for l in 0..LANES {
            let st = sa.mul_add(bc[l], sc[l].mul_add(wc[l], v * kc[l]));
            sc[l] = st;
            acc[l] = st.mul_add(rc[l], acc[l]);
        }
    }
    for i in full..n {
        let st = sa.mul_add(b[i], s[i].mul_add(w[i], v * k[i]));
        s[i] = st;
        acc[i - full] = st.mul_add(r[i], acc[i - full]);
    }
    reduce16(acc)
}

fn ssm_scan_row(s: &mut [f32], b: &[f32], c: &[f32], da: f32, x_dt: f32) -> f32 {
    ssm_scan_row_body(s, b, c, da, x_dt)
}
fn wkv6_row(s: &mut [f32], out: &mut [f32], v: &[f32], k: f32, r: f32, tf: f32, td: f32) {
    wkv6_row_body(s, out, v, k, r, tf, td)
}
fn wkv6_rows4(
    s: &mut [f32],
    out: &mut [f32],
    v: &[f32],
    k: [f32; 4],
    r: [f32; 4],
    tf: [f32; 4],
    td: [f32; 4],
) {
    wkv6_rows4_body(s, out, v, k, r, tf, td)
}
fn gla_row(s: &mut [f32], out: &mut [f32], v: &[f32], k: f32, q: f32, g: f32) {
    gla_row_body(s, out, v, k, q, g)
}
fn wkv7_row(s: &mut [f32], rwkab: [&[f32]; 5], v: f32) -> f32 {
    wkv7_row_body(s, rwkab, v)
}

/// The portable set: the bodies built without extra CPU features.
pub(crate) const PORTABLE: RecurrentKernels =
    RecurrentKernels { ssm_scan_row, wkv6_row, wkv6_rows4, gla_row, wkv7_row };

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut r = crate::testdata::Xorshift32::new(seed);
        (0..n).map(|_| r.next_f32()).collect()
    }

    /// Every tier's set (through its `KernelTable`) gives the portable set's bits.
    #[test]
    fn every_tier_matches_the_portable_set_bitwise() {
        use crate::kernels::{Isa, table_for};
        let tiers: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.is_supported()).collect();
        assert!(tiers.contains(&Isa::Scalar));
        for isa in tiers {
            let (a, sc) = (&table_for(isa).expect("supported tier").recurrent, &PORTABLE);
            for n in [1usize, 7, 16, 33, 64, 100] {
                let (b, c, v) = (data(n, 1), data(n, 2), data(n, 3));
                let (mut s1, mut s2) = (data(n, 4), data(n, 4));
                let y1 = (a.ssm_scan_row)(&mut s1, &b, &c, 0.9, 0.3);
                let y2 = (sc.ssm_scan_row)(&mut s2, &b, &c, 0.9, 0.3);
                assert_eq!(
                    (y1.to_bits(), &s1),
                    (y2.to_bits(), &s2),
                    "ssm_scan_row n={n} on {isa:?}"
                );
                let (mut o1, mut o2) = (data(n, 5), data(n, 5));
                (a.wkv6_row)(&mut s1, &mut o1, &v, 0.5, -0.25, 0.75, 0.9);
                (sc.wkv6_row)(&mut s2, &mut o2, &v, 0.5, -0.25, 0.75, 0.9);
                assert_eq!((&s1, &o1), (&s2, &o2), "wkv6_row n={n} on {isa:?}");
                // four rows at once == four single rows
                let (mut s4a, mut s4b) = (data(4 * n, 9), data(4 * n, 9));
                let (mut o4a, mut o4b) = (data(n, 10), data(n, 10));
                let (kk, rr, uu, ww) = (
                    [0.5, -0.3, 0.2, 0.9],
                    [0.1, 0.7, -0.6, 0.4],
                    [0.3, 0.2, -0.1, 0.8],
                    [0.9, 0.5, 0.7, 0.2],
                );
                (a.wkv6_rows4)(&mut s4a, &mut o4a, &v, kk, rr, uu, ww);
                for q in 0..4 {
                    (sc.wkv6_row)(
                        &mut s4b[q * n..(q + 1) * n],
                        &mut o4b,
                        &v,
                        kk[q],
                        rr[q],
                        uu[q],
                        ww[q],
                    );
                }
                assert_eq!((&s4a, &o4a), (&s4b, &o4b), "wkv6_rows4 n={n} on {isa:?}");
                (a.gla_row)(&mut s1, &mut o1, &v, 0.5, -0.25, 0.9);
                (sc.gla_row)(&mut s2, &mut o2, &v, 0.5, -0.25, 0.9);
                assert_eq!((&s1, &o1), (&s2, &o2), "gla_row n={n} on {isa:?}");
                let (r, w, k) = (data(n, 6), data(n, 7), data(n, 8));
                let y1 = (a.wkv7_row)(&mut s1, [&r, &w, &k, &b, &c], 0.3);
                let y2 = (sc.wkv7_row)(&mut s2, [&r, &w, &k, &b, &c], 0.3);
                assert_eq!((y1.to_bits(), &s1), (y2.to_bits(), &s2), "wkv7_row n={n} on {isa:?}");
            }
        }
    }
}
