//! Deterministic test data for the crate's own tests, benchmarks and examples: seeded xorshift
//! streams ([`Xorshift64`], [`Xorshift32`]), f32 vectors in [-1, 1) ([`rand_f32`], [`uniform`]),
//! random valid quantized blocks of a [`DType`] ([`random_blocks`]) and the data of ggml's
//! test-quantize-fns ([`generate_data`]).
//!
//! Not part of the supported API: hidden from the documentation and free to change between
//! releases. It is public only because integration tests, benchmarks and examples link the crate
//! from outside; one module here means they and the unit tests draw from the same generators.
//!
//! The sequences are fixed. Known answers in the tests (FNV-1a hashes of ggml's bytes, golden
//! digests) were made from these exact values, so the module's own tests pin each stream.

use crate::dtype::DType;
use crate::error::Result;

/// Marsaglia's xorshift64 (shifts 13, 7, 17): a small, fast, seedable stream with no RNG crate.
#[derive(Clone, Debug)]
pub struct Xorshift64 {
    s: u64,
}

impl Xorshift64 {
    /// A stream for `seed`: the seed times 2^64 / phi (so nearby seeds give unrelated streams),
    /// made odd so the state is never zero.
    pub fn new(seed: u64) -> Xorshift64 {
        Xorshift64 { s: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1 }
    }

    /// A stream whose state starts at `state` as given (not mixed).
    ///
    /// # Panics
    /// If `state` is zero, xorshift's one fixed point.
    pub fn from_state(state: u64) -> Xorshift64 {
        assert!(state != 0, "xorshift state must be nonzero");
        Xorshift64 { s: state }
    }

    /// The next state.
    pub fn next_u64(&mut self) -> u64 {
        self.s ^= self.s << 13;
        self.s ^= self.s >> 7;
        self.s ^= self.s << 17;
        self.s
    }

    /// Bits 32..40 of the next state.
    pub fn next_u8(&mut self) -> u8 {
        (self.next_u64() >> 32) as u8
    }

    /// The top 24 bits of the next state as a value in [-1, 1), every value exact in f32.
    pub fn next_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Marsaglia's xorshift32 (shifts 13, 17, 5), for the tests that were written on 32-bit streams.
#[derive(Clone, Debug)]
pub struct Xorshift32 {
    s: u32,
}

impl Xorshift32 {
    /// A stream for `seed`: the seed times Knuth's multiplicative constant 2654435761, made odd.
    pub fn new(seed: u32) -> Xorshift32 {
        Xorshift32 { s: seed.wrapping_mul(2_654_435_761) | 1 }
    }

    /// A stream whose state starts at `state` as given (not mixed).
    ///
    /// # Panics
    /// If `state` is zero, xorshift's one fixed point.
    pub fn from_state(state: u32) -> Xorshift32 {
        assert!(state != 0, "xorshift state must be nonzero");
        Xorshift32 { s: state }
    }

    /// The next state.
    pub fn next_u32(&mut self) -> u32 {
        self.s ^= self.s << 13;
        self.s ^= self.s >> 17;
        self.s ^= self.s << 5;
        self.s
    }

    /// The top 24 bits of the next state as a value in [-1, 1), every value exact in f32.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
    }
}

/// `n` values in [-1, 1) from [`Xorshift64::new`]`(seed)`.
///
/// ```
/// # use quantgraph::testdata::rand_f32;
/// let x = rand_f32(4, 1);
/// assert_eq!(x, rand_f32(4, 1));
/// assert!(x.iter().all(|v| (-1.0..1.0).contains(v)));
/// ```
pub fn rand_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Xorshift64::new(seed);
    (0..n).map(|_| r.next_f32()).collect()
}

/// [`rand_f32`]`(n, seed)` mapped linearly from [-1, 1) onto [`lo`, `hi`).
pub fn uniform(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    rand_f32(n, seed).iter().map(|&x| lo + (x + 1.0) * 0.5 * (hi - lo)).collect()
}

/// `n / ty.block_size()` blocks of `ty` made of random bytes from [`Xorshift64::new`]`(seed)`,
/// each kept only when its dequantized values are finite with the largest magnitude between 1e-3
/// and 1e3 (a block is drawn again otherwise). For formats where every index pattern is valid
/// and only the scales can be out of range (the IQ1 and IQ2 kinds), this gives weights without
/// their slow reference quantizers.
///
/// # Errors
/// When `ty` has no dequantizer.
pub fn random_blocks(ty: DType, n: usize, seed: u64) -> Result<Vec<u8>> {
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let mut r = Xorshift64::new(seed);
    let mut out = Vec::with_capacity(n / bs * ts);
    let mut vals = vec![0f32; bs];
    for _ in 0..n / bs {
        loop {
            let block: Vec<u8> = (0..ts).map(|_| r.next_u8()).collect();
            crate::quant::dequantize(ty, &block, &mut vals)?;
            let max = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
            if vals.iter().all(|v| v.is_finite()) && max > 1e-3 && max < 1e3 {
                out.extend(block);
                break;
            }
        }
    }
    Ok(out)
}

/// ggml's `generate_data` from tests/test-quantize-fns.cpp: `0.1 + 2*cosf(i + offset)`, the sum
/// taken in double (the `0.1` is a C double) and rounded to f32.
pub fn generate_data(offset: f32, n: usize) -> Vec<f32> {
    (0..n).map(|i| (0.1f64 + (2.0 * (i as f32 + offset).cos()) as f64) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fnv(words: impl Iterator<Item = u64>, width: usize) -> u64 {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for w in words {
            for c in &w.to_le_bytes()[..width] {
                h = (h ^ *c as u64).wrapping_mul(0x100_0000_01b3);
            }
        }
        h
    }

    fn fnv_f32(v: &[f32]) -> u64 {
        fnv(v.iter().map(|x| x.to_bits() as u64), 4)
    }

    /// The streams give the values the known answers in the tests were made from (hashes taken
    /// from the generators as first written, before they moved here).
    #[test]
    fn streams_keep_their_sequences() {
        assert_eq!(fnv_f32(&rand_f32(1000, 1)), 0x55ab_530a_52e1_389c);
        assert_eq!(fnv_f32(&rand_f32(1000, 42)), 0xc442_fc73_d30d_5c57);
        assert_eq!(fnv_f32(&uniform(1000, 3, -1.0, -0.5)), 0x4c81_d9af_6a1a_1f78);
        let mut r = Xorshift64::from_state(0x2545_F491_4F6C_DD1D);
        assert_eq!(fnv((0..100).map(|_| r.next_u64()), 8), 0x0488_3536_c59f_6ddc);
        for (seed, want) in [(1, 0xceff_9126_e738_417c), (9, 0x7c03_71ad_1ac8_efaa)] {
            let mut r = Xorshift32::new(seed);
            let v: Vec<f32> = (0..1000).map(|_| r.next_f32()).collect();
            assert_eq!(fnv_f32(&v), want, "seed {seed}");
        }
        let mut r = Xorshift32::from_state(0x9E37_79B9);
        assert_eq!(fnv((0..100).map(|_| r.next_u32() as u64), 4), 0x1d4c_5dd2_c27a_1151);
    }

    #[test]
    fn new_seeds_are_mixed_and_odd() {
        assert_eq!(Xorshift64::new(1).s, 0x9E37_79B9_7F4A_7C15);
        assert_eq!(Xorshift64::new(0).s, 1);
        assert_eq!(Xorshift32::new(0).s, 1);
    }

    #[test]
    fn random_blocks_dequantize_to_moderate_finite_values() {
        for ty in [DType::IQ1_S, DType::IQ2_XXS, DType::Q4_0] {
            let n = 2 * ty.block_size();
            let q = random_blocks(ty, n, 5).unwrap();
            assert_eq!(q.len(), 2 * ty.type_size());
            assert_eq!(q, random_blocks(ty, n, 5).unwrap());
            let mut v = vec![0f32; n];
            crate::quant::dequantize(ty, &q, &mut v).unwrap();
            assert!(v.iter().all(|x| x.is_finite() && x.abs() < 1e3), "{ty}");
        }
    }
}
