//! Unit tests of the scalar K-quant code itself (the public API may dispatch `vec_dot` to SIMD
//! kernels; these call the scalar functions directly).

use super::*;
use crate::quant::util::fp32_to_fp16;
use crate::testdata::rand_f32;

fn golden(name: &str) -> Vec<u8> {
    let p =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden/quant").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

const TYPES: [(&str, FormatFns); 5] = [
    ("q2_K", Q2_K_FNS),
    ("q3_K", Q3_K_FNS),
    ("q4_K", Q4_K_FNS),
    ("q5_K", Q5_K_FNS),
    ("q6_K", Q6_K_FNS),
];

#[test]
fn block_sizes_match_ggml() {
    assert_eq!(size_of::<BlockQ2K>(), 84);
    assert_eq!(size_of::<BlockQ3K>(), 110);
    assert_eq!(size_of::<BlockQ4K>(), 144);
    assert_eq!(size_of::<BlockQ5K>(), 176);
    assert_eq!(size_of::<BlockQ6K>(), 210);
    assert_eq!(size_of::<BlockQ8K>(), 292);
    assert_eq!(align_of::<BlockQ8K>(), 4);
}

/// Bits of ggml's `ggml_vec_dot_qX_K_q8_K_generic` (src/ggml-cpu/quants.c at d99724f, compiled
/// with -O2 for x86-64 without FMA) on the golden rows: the scalar dot is bit-exact with it.
/// (The golden `vec_dot` values come from ggml's AVX2 kernels and differ in the last bits.)
#[test]
fn scalar_vec_dot_is_bit_exact_with_ggml_generic() {
    let want: [[u32; 4]; 5] = [
        [0xc252d8a2, 0x3d7c9898, 0x00000000, 0xc08b9d4d],
        [0xc21aaaa2, 0x3d67ce94, 0x00000000, 0xc08ba608],
        [0xc22bddb8, 0x3e3f67ac, 0x00000000, 0xc08ba5e4],
        [0xc230768d, 0x3df7dc30, 0x00000000, 0xc08b9f04],
        [0xc220fa98, 0x3e111706, 0x00000000, 0xc08ba608],
    ];
    let y = golden("y.q8_K.bin");
    let n = 1024;
    let yr = 4 * size_of::<BlockQ8K>();
    for ((name, fns), bits) in TYPES.iter().zip(want) {
        let x = golden(&format!("{name}.q.bin"));
        let xr = x.len() / 4;
        let dot = fns.vec_dot.unwrap();
        for r in 0..4 {
            let got = dot(n, &x[r * xr..(r + 1) * xr], &y[r * yr..(r + 1) * yr]);
            assert_eq!(got.to_bits(), bits[r], "{name} row {r}: {got}");
        }
    }
}

/// Ten rows of 256 with zero, constant, tiny, huge, NaN, infinite and subnormal values (the same
/// as `edge_rows` in tests/quant_kquants.rs).
fn edge_rows() -> Vec<f32> {
    let x = floats(&golden("x.f32"));
    let mut e = vec![0f32; 10 * 256];
    for i in 0..256 {
        e[256 + i] = 0.3125;
        e[2 * 256 + i] = 1e-30;
        e[3 * 256 + i] = -1e30;
        e[4 * 256 + i] = f32::NAN;
        e[5 * 256 + i] = x[i];
        e[6 * 256 + i] = x[256 + i];
        e[7 * 256 + i] = x[i] * 1e-38;
        e[8 * 256 + i] = if i & 1 == 1 { 1e30 } else { -1e-30 };
        e[9 * 256 + i] = x[512 + i];
    }
    e[5 * 256 + 17] = f32::NAN;
    e[6 * 256 + 3] = f32::INFINITY;
    e[9 * 256 + 100] = f32::NEG_INFINITY;
    e
}

/// ggml's generic dot on the edge rows, each row against the same row in Q8_K (NaNs included).
#[test]
fn scalar_vec_dot_on_edge_rows_matches_ggml_generic() {
    let want: [[u32; 10]; 5] = [
        [0, 0x41c7f380, 0, 0x7f800000, 0, 0x43de26b2, 0xffc00000, 0, 0xffc00000, 0xffc00000],
        [0, 0x41c80000, 0, 0, 0, 0x43d75f12, 0xffc00000, 0, 0, 0xffc00000],
        [0, 0x41c7ffcf, 0, 0x7f800000, 0, 0x43e070ba, 0xffc00000, 0, 0xffc00000, 0xffc00000],
        [0, 0x41c7f5f7, 0, 0x7f800000, 0, 0x43e02a5e, 0xffc00000, 0, 0xffc00000, 0xffc00000],
        [0, 0x41c80000, 0, 0, 0, 0x43d96ca3, 0xffc00000, 0, 0, 0xffc00000],
    ];
    let e = edge_rows();
    let mut y = vec![0u8; 10 * size_of::<BlockQ8K>()];
    (Q8_K_FNS.from_float.unwrap())(&e, &mut y);
    for ((name, fns), bits) in TYPES.iter().zip(want) {
        let ts = match *name {
            "q2_K" => 84,
            "q3_K" => 110,
            "q4_K" => 144,
            "q5_K" => 176,
            _ => 210,
        };
        let mut x = vec![0u8; 10 * ts];
        (fns.quantize.unwrap())(&e, &mut x, e.len(), None).unwrap();
        for r in 0..10 {
            let got =
                (fns.vec_dot.unwrap())(256, &x[r * ts..(r + 1) * ts], &y[r * 292..(r + 1) * 292]);
            let w = f32::from_bits(bits[r]);
            if w.is_nan() {
                assert!(got.is_nan(), "{name} row {r}: {got}, ggml NaN");
            } else {
                assert_eq!(got.to_bits(), bits[r], "{name} row {r}: {got} vs {w}");
            }
        }
    }
}

#[test]
fn misaligned_block_reads_and_writes() {
    let x: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
    let mut aligned = vec![0u8; 2 * 292];
    (Q8_K_FNS.from_float.unwrap())(&x, &mut aligned);
    // A u32-backed buffer guarantees that offsets 1..4 are truly misaligned for the f32 field.
    let mut store = vec![0u32; 2 * 292 / 4 + 2];
    for off in 1..4 {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut store);
        let dst = &mut bytes[off..off + 2 * 292];
        (Q8_K_FNS.from_float.unwrap())(&x, dst);
        assert_eq!(dst, &aligned[..]);
        let got: Vec<BlockQ8K> = blocks(dst).collect();
        assert_eq!(got[1].d.to_bits(), blocks::<BlockQ8K>(&aligned).nth(1).unwrap().d.to_bits());
        let mut back = vec![0f32; 512];
        (Q8_K_FNS.dequantize.unwrap())(dst, &mut back);
        for (a, b) in x.iter().zip(&back) {
            assert!((a - b).abs() < 0.06, "{a} vs {b}");
        }
    }
}

#[test]
fn q6_k_zero_block_is_all_zero_bytes() {
    let b = q6_k::quantize_row_q6_K_ref(&[0.0; QK_K]);
    assert!(bytemuck::bytes_of(&b).iter().all(|&v| v == 0));
    assert_eq!(b.d, fp32_to_fp16(0.0));
}

#[test]
fn quantize_rows_rejects_partial_rows() {
    let x = [0.5f32; 300];
    let mut out = [0u8; 84 * 2];
    assert!((Q2_K_FNS.quantize.unwrap())(&x, &mut out, 300, None).is_err());
    assert!((Q2_K_FNS.quantize.unwrap())(&x[..256], &mut out, 256, None).is_err());
    assert!(
        (Q2_K_FNS.quantize.unwrap())(&x[..256], &mut out[..84], 256, Some(&[1.0; 10])).is_err()
    );
}

/// The helper variants the K-quants do not use themselves (other `rmse_type`s, `make_q3_quants`
/// without refinement, `make_qkx3_quants` with `x^2` weights, `nstep == 0`) against ggml's
/// static functions, compiled from ggml-quants.c at d99724f: FNV-1a of every `L` and result.
#[test]
fn helpers_match_ggml_on_every_variant() {
    use helpers::*;
    let sc = [1e-4f32, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0, 1e4];
    let mut x = rand_f32(64 * 512, 42);
    for (i, v) in x.iter_mut().enumerate() {
        *v *= sc[(i / 512) % 9];
        if i % 37 == 0 {
            *v *= 8.0;
        }
    }
    let w: Vec<f32> = x.iter().map(|v| v.abs() + 0.5).collect();
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut feed = |b: &[u8]| {
        for &c in b {
            h = (h ^ c as u64).wrapping_mul(0x0100_0000_01b3);
        }
    };
    for g in 0..18 * 16 {
        let (xg, wg) = (&x[32 * g..32 * g + 32], &w[32 * g..32 * g + 32]);
        let (mut l, mut u, mut a) = ([0i8; 32], [0u8; 32], [0u8; 32]);
        for t in [0, 1, 2, 3, 4, -1, -2] {
            let r = make_qx_quants(15, xg, &mut l, t, None);
            feed(bytemuck::cast_slice(&l));
            feed(&r.to_le_bytes());
        }
        let r = make_qx_quants(7, xg, &mut l, 1, Some(wg));
        feed(bytemuck::cast_slice(&l));
        feed(&r.to_le_bytes());
        let r = make_q3_quants(4, xg, &mut l, false);
        feed(bytemuck::cast_slice(&l));
        feed(&r.to_le_bytes());
        let sm = make_qkx3_quants(15, xg, None, &mut u, &mut a, -0.9, 0.05, 36, false);
        feed(&u);
        feed(&sm.scale.to_le_bytes());
        feed(&sm.min.to_le_bytes());
        let sm = make_qkx2_quants(7, xg, wg, &mut u, &mut a, -0.5, 0.1, 0, true);
        feed(&u);
        feed(&sm.scale.to_le_bytes());
        feed(&sm.min.to_le_bytes());
    }
    assert_eq!(h, 0x03fa_370e_6c83_7e7e);
}
