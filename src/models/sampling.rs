//! Picking the next token from logits: greedy, or sampling with llama.cpp's default chain
//! (repetition penalty, top-k, top-p, min-p, temperature, then a seeded draw).

use super::llama::argmax;
use crate::error::{Error, Result};
use std::collections::VecDeque;

/// Sampling settings. `temperature <= 0` is greedy (argmax after the repetition penalty).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SamplerParams {
    /// Divides the logits before the draw; 0 or less picks the most likely token.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probabilities sum to `top_p` (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0: none).
    pub min_p: f32,
    /// Divides positive logits and multiplies negative ones of recent tokens (1: off).
    pub repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    pub repeat_last_n: usize,
    /// Seed of the random draw: the same seed, logits and settings give the same tokens.
    pub seed: u64,
}

impl Default for SamplerParams {
    /// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no repetition
    /// penalty (last 64 tokens when set), seed 0.
    fn default() -> SamplerParams {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerParams {
    /// Greedy decoding: always the most likely token.
    pub fn greedy() -> SamplerParams {
        SamplerParams { temperature: 0.0, ..SamplerParams::default() }
    }

    fn validate(&self) -> Result<()> {
        let p = self;
        if !(p.temperature.is_finite()
            && (0.0..=1.0).contains(&p.top_p)
            && (0.0..=1.0).contains(&p.min_p)
            && p.repeat_penalty.is_finite()
            && p.repeat_penalty > 0.0)
        {
            return Err(Error::param("sampler", format!("invalid settings {p:?}")));
        }
        Ok(())
    }
}

/// A sampler: its settings, its random state and the recent tokens the penalty looks at.
#[derive(Clone, Debug)]
pub struct Sampler {
    p: SamplerParams,
    rng: u64,
    recent: VecDeque<u32>,
}

impl Sampler {
    /// A sampler; `Err` for a temperature that is not finite, `top_p` or `min_p` outside
    /// 0..=1, or a repetition penalty that is not positive.
    pub fn new(p: SamplerParams) -> Result<Sampler> {
        p.validate()?;
        let rng = p.seed;
        Ok(Sampler { p, rng, recent: VecDeque::new() })
    }

    /// The settings.
    pub fn params(&self) -> &SamplerParams {
        &self.p
    }

    /// Records a token as produced (or fed), for the repetition penalty.
    pub fn accept(&mut self, id: u32) {
        if self.p.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.p.repeat_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(id);
    }

    /// Forgets the recent tokens (the random state goes on).
    pub fn reset(&mut self) {
        self.recent.clear();
    }

    /// splitmix64: a uniform draw in [0, 1).
    fn uniform(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Picks the next token from one row of logits. `Err` for an empty row.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        if logits.is_empty() {
            return Err(Error::arg("sampler: no logits"));
        }
        let mut l: Vec<f32> =
            logits.iter().map(|&x| if x.is_nan() { f32::NEG_INFINITY } else { x }).collect();
        if self.p.repeat_penalty != 1.0 {
            let mut seen: Vec<u32> = self.recent.iter().copied().collect();
            seen.sort_unstable();
            seen.dedup();
            for id in seen {
                if let Some(x) = l.get_mut(id as usize) {
                    *x = if *x > 0.0 {
                        *x / self.p.repeat_penalty
                    } else {
                        *x * self.p.repeat_penalty
                    };
                }
            }
        }
        if self.p.temperature <= 0.0 {
            return Ok(argmax(&l));
        }
        // Candidates, most likely first (lower id first on ties).
        let mut c: Vec<(u32, f32)> = l.iter().enumerate().map(|(i, &x)| (i as u32, x)).collect();
        let cmp = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if self.p.top_k > 0 && self.p.top_k < c.len() {
            c.select_nth_unstable_by(self.p.top_k - 1, cmp);
            c.truncate(self.p.top_k);
        }
        c.sort_by(cmp);
        let probs = |c: &[(u32, f32)], t: f32| -> Vec<f64> {
            let m = c[0].1 as f64;
            let e: Vec<f64> = c.iter().map(|&(_, x)| ((x as f64 - m) / t as f64).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(|x| x / s).collect()
        };
        if self.p.top_p < 1.0 {
            let p = probs(&c, 1.0);
            let mut cum = 0.0;
            let mut keep = c.len();
            for (i, &pi) in p.iter().enumerate() {
                cum += pi;
                if cum >= self.p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep.max(1));
        }
        if self.p.min_p > 0.0 {
            let cut = c[0].1 + self.p.min_p.ln();
            let keep = c.iter().take_while(|&&(_, x)| x >= cut).count();
            c.truncate(keep.max(1));
        }
        let p = probs(&c, self.p.temperature);
        let u = self.uniform();
        let mut cum = 0.0;
        for (i, &pi) in p.iter().enumerate() {
            cum += pi;
            if u < cum {
                return Ok(c[i].0);
            }
        }
        Ok(c[c.len() - 1].0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_largest_after_the_penalty() {
        let mut s =
            Sampler::new(SamplerParams { repeat_penalty: 4.0, ..SamplerParams::greedy() }).unwrap();
        assert_eq!(s.sample(&[0.0, 3.0, 2.0]).unwrap(), 1);
        s.accept(1);
        assert_eq!(s.sample(&[0.0, 3.0, 2.0]).unwrap(), 2);
    }

    #[test]
    fn top_k_one_is_greedy_and_seeds_repeat() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let mut s = Sampler::new(SamplerParams { top_k: 1, ..SamplerParams::default() }).unwrap();
        for _ in 0..10 {
            assert_eq!(s.sample(&logits).unwrap(), argmax(&logits));
        }
        let draw = |seed| {
            let mut s = Sampler::new(SamplerParams {
                seed,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                temperature: 1.5,
                ..SamplerParams::default()
            })
            .unwrap();
            (0..50).map(|_| s.sample(&logits).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        // At a high temperature more than one token comes out.
        let d = draw(7);
        assert!(d.iter().any(|&x| x != d[0]));
    }

    #[test]
    fn min_p_and_top_p_cut_unlikely_tokens() {
        // Token 0 has almost all the mass: both cuts leave only it.
        let logits = [10.0f32, 0.0, 0.0, 0.0];
        for p in [
            SamplerParams { top_k: 0, top_p: 0.5, min_p: 0.0, ..SamplerParams::default() },
            SamplerParams { top_k: 0, top_p: 1.0, min_p: 0.01, ..SamplerParams::default() },
        ] {
            let mut s = Sampler::new(p).unwrap();
            for _ in 0..20 {
                assert_eq!(s.sample(&logits).unwrap(), 0);
            }
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(Sampler::new(SamplerParams { top_p: 1.5, ..SamplerParams::default() }).is_err());
        assert!(
            Sampler::new(SamplerParams { repeat_penalty: 0.0, ..SamplerParams::default() })
                .is_err()
        );
        let mut s = Sampler::new(SamplerParams::default()).unwrap();
        assert!(s.sample(&[]).is_err());
    }
}
