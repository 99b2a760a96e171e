//! What every subcommand measures with: medians of repeated computes and a digest of the output.

use quantgraph::Plan;
use std::time::Instant;

/// The middle value of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

/// One warm-up compute, then the median wall time of `reps` computes, in seconds.
pub fn median_compute_secs(plan: &mut Plan, reps: usize) -> quantgraph::Result<f64> {
    Ok(median_and_best_compute_secs(plan, reps)?.0)
}

/// One warm-up compute, then (median, best) wall time of `reps` computes, in seconds: on a busy
/// machine the best run is the steadier side-by-side figure.
pub fn median_and_best_compute_secs(
    plan: &mut Plan,
    reps: usize,
) -> quantgraph::Result<(f64, f64)> {
    plan.compute()?;
    let mut times = Vec::new();
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        plan.compute()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    Ok((median(times), best))
}

/// FNV-1a of a tensor's bytes after the last compute: two builds that print the same digest for
/// the same command computed the same bits.
pub fn digest(plan: &Plan, id: quantgraph::TensorId) -> String {
    let bytes = plan.output_bytes(id).unwrap_or(&[]);
    let h = bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    format!("{h:016x}")
}
