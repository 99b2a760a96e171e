//! x86-64 tiers. Each file is one tier with the same function names as `../scalar.rs`.

pub(crate) mod avx2;
pub(crate) mod avx2_conv; // vision: conv_2d / conv_3d register tile
mod avx2_gemm;
pub(crate) mod avx2_iq;
mod avx2_quants;
mod avx2_repack;
mod avx2_sgemm;
pub(crate) mod avx512;
mod avx512_gemm;
mod avx512_repack;
// --- ops ---
pub(crate) mod avx2_elementwise; // swiglu, gelu gather, rope rotation, attention scores
// --- end ops ---

use super::KernelTable;

/// Overwrites the table entries that the AVX2 (+FMA, F16C) tier implements.
pub(crate) fn plug_avx2(t: &mut KernelTable) {
    t.dot_f32 = avx2::dot_f32;
    t.add_f32 = avx2::add_f32;
    t.sub_f32 = avx2::sub_f32;
    t.mul_f32 = avx2::mul_f32;
    t.div_f32 = avx2::div_f32;
    t.silu_f32 = avx2::silu_vexp_f32;
    t.exp_sub_sum_f32 = avx2::exp_sub_sum_f32;
    t.f16_to_f32 = avx2::f16_to_f32;
    t.sum_sq_f64 = avx2::sum_sq_f64;
    t.f16_bytes_to_f32 = avx2::f16_bytes_to_f32;
    t.mad_f16 = avx2::mad_f16;
    t.mad_f32 = avx2::mad_f32;
    t.set_from_float(crate::dtype::DType::Q8_0, avx2::from_float_q8_0);
    t.set_from_float(crate::dtype::DType::Q8_1, avx2::from_float_q8_1);
    t.gelu_f32 = avx2::gelu_f32;
    t.relu_f32 = avx2::relu_f32;
    avx2_quants::plug(t);
    avx2_iq::plug(t);
    avx2_gemm::plug(t);
    t.sgemm = avx2_sgemm::sgemm_6x16;
    t.sgemm_pack = avx2_sgemm::pack_strip;
    t.sgemm_pack_f16 = avx2_sgemm::pack_strip_f16;
    t.round_f16 = avx2_sgemm::round_f16;
    t.round_bf16 = avx2_sgemm::round_bf16;
    avx2_repack::plug(t);
    // --- ops ---
    avx2_elementwise::plug(t);
    // --- end ops ---
}
