//! `vec-dot`: one row's dot product per type, timed like ggml's side-by-side harness.

use crate::measure::median;
use quantgraph::DType;
use quantgraph::testdata::rand_f32;
use std::time::Instant;

/// Median over `reps` of the mean time of 1000 dot products of one `n`-element row, the method of
/// ggml's side-by-side harness. By default through the public `quant::vec_dot` (dispatch and length
/// checks on every call); with `kernel` through a [`quantgraph::kernels::VecDotKernel`] bound once,
/// which calls the selected tier's kernel the way ggml's harness calls `type_traits_cpu[t].vec_dot`.
pub fn vec_dot(ty: DType, n: usize, reps: usize, kernel: bool) -> quantgraph::Result<()> {
    let x = rand_f32(n, 1);
    let y = rand_f32(n, 2);
    let mut xq = vec![0u8; ty.row_size(n)?];
    crate::matmul::quantize_rows(ty, &x, n, &mut xq)?;
    let vd = ty.vec_dot_type();
    let mut yq = vec![0u8; vd.row_size(n)?];
    quantgraph::quant::quantize_for_dot(vd, &y, &mut yq)?;
    let inner = 1000;
    let bound = quantgraph::kernels::VecDotKernel::new(quantgraph::kernels::selected_isa(), ty, n)?;
    let mut times = Vec::new();
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        if kernel {
            for _ in 0..inner {
                std::hint::black_box(bound.dot(std::hint::black_box(&xq), &yq)?);
            }
        } else {
            for _ in 0..inner {
                std::hint::black_box(quantgraph::quant::vec_dot(
                    ty,
                    n,
                    std::hint::black_box(&xq),
                    &yq,
                )?);
            }
        }
        times.push(t0.elapsed().as_secs_f64() / inner as f64);
    }
    println!(
        "quantgraph vec_dot {} n={n} isa={} median_ns={:.1}",
        ty.name(),
        quantgraph::kernels::selected_isa().name(),
        median(times) * 1e9
    );
    Ok(())
}
