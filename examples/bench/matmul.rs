//! `matmul` and `mul_mat_id`: one weight matrix (or a stack of experts) of a type times F32
//! activations, in GFLOPS, optionally on CPU_REPACK weights.

use crate::measure::{digest, median_and_best_compute_secs, median_compute_secs};
use crate::peaks;
use quantgraph::testdata::rand_f32;
use quantgraph::{Backend, Buffer, BufferType, CpuBackend, DType, Graph, Plan};

/// The options of `bench matmul`.
pub struct Flags {
    /// `--repack`: the weight in the CPU_REPACK buffer type.
    pub repack: bool,
    /// `--share`: the row's share of the peak that bounds it.
    pub share: bool,
}

/// `bench matmul TYPE M N K THREADS REPS`: `mul_mat` of a [K, M] weight of `ty` and F32
/// activations [K, N]; flops = 2 M N K. `--repack` stores the weight in the CPU_REPACK buffer type.
/// `--share` also measures the peak that bounds the row ([`peaks::bounding_peak`]) just before and
/// just after the timed computes and prints the row's share of their mean: the machine's speed
/// drifts, and a peak read minutes apart from the row can move its share by a third.
pub fn matmul(
    ty: DType,
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
    reps: usize,
    Flags { repack, share }: Flags,
) -> quantgraph::Result<()> {
    let be = CpuBackend::with_threads(threads)?;
    let bytes = weight_bytes(ty, k, m)?;
    let wbuf = weight_buffer(ty, &[k, m], bytes, repack)?;
    let mut g = Graph::new();
    let w = g.weight(ty, &[k, m], &wbuf, 0)?;
    let x = g.input(DType::F32, &[k, n])?;
    let y = g.mul_mat(w, x)?;
    g.set_output(y)?;
    let mut plan = Plan::new(g, &be)?;
    plan.set_input(x, &rand_f32(k * n, 2))?;
    // Without VNNI, also the peak of 8-bit weight codes (`int8_maddubs_wide_peak`), which
    // bounds the types whose codes take all 8 bits there (Q8_0 and the IQ types' signed forms).
    let before = if share { peaks::bounding_peak(ty, be.n_threads()) } else { None };
    let maddubs = matches!(before, Some(("int8_maddubs", _)));
    let wide = || maddubs.then(|| peaks::int8_maddubs_wide_peak(be.n_threads())).flatten();
    let wide_before = wide();
    let (t, best) = median_and_best_compute_secs(&mut plan, reps)?;
    let wide_after = wide();
    let after = if share { peaks::bounding_peak(ty, be.n_threads()) } else { None };
    let gflops = 2.0 * (m * n * k) as f64 / t / 1e9;
    let best_gflops = 2.0 * (m * n * k) as f64 / best / 1e9;
    let mut suffix = if repack {
        format!(" buffer=CPU_REPACK weight_bytes={}", wbuf.len())
    } else {
        String::new()
    };
    if let (Some((name, p0)), Some((_, p1))) = (before, after) {
        let share = gflops / ((p0 + p1) / 2.0);
        suffix += &format!(" peak={name} peak_before={p0:.1} peak_after={p1:.1} share={share:.3}");
    }
    if let (Some(w0), Some(w1)) = (wide_before, wide_after) {
        let share = gflops / ((w0 + w1) / 2.0);
        suffix += &format!(" wide_before={w0:.1} wide_after={w1:.1} wide_share={share:.3}");
    }
    println!(
        "quantgraph matmul {} {m} {n} {k} threads={} median_ms={:.3} gflops={gflops:.1} best_gflops={best_gflops:.1}{suffix} digest={}",
        ty.name(),
        be.n_threads(),
        t * 1e3,
        digest(&plan, y)
    );
    Ok(())
}

/// `bench decode-stream TYPE M K THREADS REPS [TOTAL_MIB]`: decode (N = 1) through enough copies
/// of a [K, M] weight of `ty` that their bytes (at least `TOTAL_MIB`, default 1024) exceed the
/// last-level cache, one `mul_mat` per copy in one graph: every compute streams all the weights
/// from memory. Prints the weight read rate (GB/s), to be set against `bench bandwidth`'s
/// `read_bandwidth` line of the same run.
pub fn decode_stream(
    ty: DType,
    m: usize,
    k: usize,
    threads: usize,
    reps: usize,
    total_mib: usize,
) -> quantgraph::Result<()> {
    let be = CpuBackend::with_threads(threads)?;
    let bytes = weight_bytes(ty, k, m)?;
    let total = total_mib.checked_mul(1 << 20).filter(|_| !bytes.is_empty()).ok_or_else(|| {
        quantgraph::Error::InvalidArgument(format!(
            "decode-stream: need M, K > 0 and TOTAL_MIB below 2^44 (M {m}, K {k}, TOTAL_MIB {total_mib})"
        ))
    })?;
    let copies = total.div_ceil(bytes.len()).max(2);
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[k, 1])?;
    let mut ys = Vec::with_capacity(copies);
    for _ in 0..copies {
        // The graph keeps its own handle to each copy's buffer.
        let w = g.weight(ty, &[k, m], &Buffer::from_host(bytes.clone()), 0)?;
        let y = g.mul_mat(w, x)?;
        g.set_output(y)?;
        ys.push(y);
    }
    let mut plan = Plan::new(g, &be)?;
    plan.set_input(x, &rand_f32(k, 2))?;
    let t = median_compute_secs(&mut plan, reps)?;
    let total = (bytes.len() * copies) as f64;
    println!(
        "quantgraph decode_stream {} {m} 1 {k} threads={} copies={copies} weight_mib={:.0} median_ms_per_matmul={:.3} gbps={:.1} digest={}",
        ty.name(),
        be.n_threads(),
        total / (1 << 20) as f64,
        t * 1e3 / copies as f64,
        total / t / 1e9,
        digest(&plan, ys[copies - 1])
    );
    Ok(())
}

/// `rows` rows of `k` random weights (seed 1) in type `ty`, as the matmul benches store them.
fn weight_bytes(ty: DType, k: usize, rows: usize) -> quantgraph::Result<Vec<u8>> {
    let a = rand_f32(rows * k, 1);
    let mut bytes = vec![0u8; ty.row_size(k)? * rows];
    quantize_rows(ty, &a, k, &mut bytes)?;
    Ok(bytes)
}

/// `x` (rows of `k` values) in type `ty`. IQ1_S, IQ2_XXS and IQ2_XS, which ggml quantizes only
/// with an importance matrix, take a uniform one, as ggml's side-by-side harness does.
pub fn quantize_rows(ty: DType, x: &[f32], k: usize, out: &mut [u8]) -> quantgraph::Result<()> {
    match ty {
        DType::F32 => out.copy_from_slice(bytemuck::cast_slice(x)),
        DType::F16 | DType::BF16 => quantgraph::quant::quantize_for_dot(ty, x, out)?,
        DType::IQ1_S | DType::IQ2_XXS | DType::IQ2_XS => {
            quantgraph::quant::quantize_with_imatrix(ty, x, k, &vec![1.0; k], out)?
        }
        _ => quantgraph::quant::quantize(ty, x, out)?,
    }
    Ok(())
}

/// The weights in a plain buffer, or (with `--repack`) in the CPU_REPACK buffer type: repacked on
/// the way in, the plain bytes dropped right after, so only one copy stays alive.
fn weight_buffer(
    ty: DType,
    ne: &[usize],
    bytes: Vec<u8>,
    repack: bool,
) -> quantgraph::Result<Buffer> {
    if !repack {
        return Ok(Buffer::from_host(bytes));
    }
    let b = quantgraph::CpuRepackBufferType.alloc(bytes.len())?;
    b.set_tensor(0, ty, ne, &bytes)?;
    Ok(b)
}

/// `bench mul_mat_id TYPE M N K N_EXPERT N_USED THREADS REPS`: mul_mat_id as test-backend-ops
/// times it: `as` [K, M, E] weights, b F32 [K, U, N] (one row per slot), ids [U, N] picking U
/// distinct experts per token; flops = 2 M N K U. `--repack` stores the experts in the CPU_REPACK
/// buffer type.
#[allow(clippy::too_many_arguments)]
pub fn mul_mat_id(
    ty: DType,
    m: usize,
    n: usize,
    k: usize,
    experts: usize,
    used: usize,
    threads: usize,
    reps: usize,
    repack: bool,
) -> quantgraph::Result<()> {
    if used == 0 || used > experts {
        return Err(quantgraph::Error::InvalidArgument(format!(
            "mul_mat_id bench: need 1 <= N_USED ({used}) <= N_EXPERT ({experts})"
        )));
    }
    let be = CpuBackend::with_threads(threads)?;
    let bytes = weight_bytes(ty, k, m * experts)?;
    let wbuf = weight_buffer(ty, &[k, m, experts], bytes, repack)?;
    let mut g = Graph::new();
    let w = g.weight(ty, &[k, m, experts], &wbuf, 0)?;
    let x = g.input(DType::F32, &[k, used, n])?;
    let ids = g.input(DType::I32, &[used, n])?;
    let y = g.mul_mat_id(w, x, ids)?;
    g.set_output(y)?;
    let mut plan = Plan::new(g, &be)?;
    plan.set_input(x, &rand_f32(k * used * n, 2))?;
    // Token t uses experts t, t + 1, ... (mod E): every expert gets work as in a real batch.
    let ids_v: Vec<i32> =
        (0..n).flat_map(|t| (0..used).map(move |s| ((t + s) % experts) as i32)).collect();
    plan.set_input(ids, &ids_v)?;
    let t = median_compute_secs(&mut plan, reps)?;
    let gflops = 2.0 * (m * n * k * used) as f64 / t / 1e9;
    println!(
        "quantgraph mul_mat_id {} {m} {n} {k} experts={experts} used={used} threads={} median_ms={:.3} gflops={gflops:.1}{}",
        ty.name(),
        be.n_threads(),
        t * 1e3,
        if repack { " buffer=CPU_REPACK" } else { "" }
    );
    Ok(())
}
