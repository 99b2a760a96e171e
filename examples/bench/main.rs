//! Benchmarks with one line of output per run, compared against ggml's runs of the same shapes.
//!
//! ```text
//! cargo run --release --example bench -- node-overhead NODES THREADS
//! cargo run --release --example bench -- plan-overhead NODES
//! cargo run --release --example bench -- matmul TYPE M N K THREADS REPS [--repack] [--share]
//! cargo run --release --example bench -- mul_mat_id TYPE M N K N_EXPERT N_USED THREADS REPS [--repack]
//! cargo run --release --example bench -- vec-dot TYPE N REPS [--kernel]
//! cargo run --release --example bench -- peak THREADS
//! cargo run --release --example bench -- bandwidth THREADS
//! cargo run --release --example bench -- decode-stream TYPE M K THREADS REPS [TOTAL_MIB]
//! cargo run --release --example bench -- op NAME THREADS REPS
//! cargo run --release --example bench -- train-op NAME THREADS REPS
//! cargo run --release --example bench -- model tiny|large|FILE.gguf THREADS [N_PROMPT] [N_GEN] [--repack]
//!     [--ctx N_CTX] [--depth TOKENS] [--reps R] [--kv-step CELLS]
//! ```
//! `model` with a llama-architecture GGUF file prints prefill and decode tokens/s in the form of
//! llama-bench's pp / tg (last-token logits for the prompt, median decode step).
//! Times are medians over repetitions; the machine is noisy, so compare ratios measured together.
//!
//! Each line starts `quantgraph <what>` and, where the output is checked, ends in `digest=`;
//! scripts read these fields, so they stay as they are. One module per subcommand family:
//! [`overhead`] (node-overhead, plan-overhead), [`matmul`] (matmul, mul_mat_id, decode-stream), [`vec_dot`],
//! [`ops`] (op), [`train`] (train-op), [`model`], [`peaks`] (peak, bandwidth); [`measure`] holds
//! the timing and the digest they share.

mod matmul;
mod measure;
mod model;
mod ops;
mod overhead;
mod peaks;
mod train;
mod vec_dot;

use quantgraph::DType;

/// Argument `i` parsed as `T`; a missing or unparsable one exits with status 2.
fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> T {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        eprintln!("missing or bad argument {i}: {what}");
        std::process::exit(2)
    })
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let repack = args.iter().any(|a| a == "--repack");
    let share = args.iter().any(|a| a == "--share");
    args.retain(|a| a != "--repack" && a != "--share");
    // `--name N` options of `model`, taken out of the positional arguments.
    let mut opt = |name: &str| -> Option<usize> {
        let i = args.iter().position(|a| a == name)?;
        let v = args.get(i + 1).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            eprintln!("{name} needs a number");
            std::process::exit(2)
        });
        args.drain(i..i + 2);
        Some(v)
    };
    let model_opts = model::Options {
        n_ctx: opt("--ctx"),
        depth: opt("--depth").unwrap_or(0),
        reps: opt("--reps").unwrap_or(1),
        kv_step: opt("--kv-step"),
    };
    let r = match args.first().map(String::as_str) {
        Some("node-overhead") => {
            overhead::node_overhead(arg(&args, 1, "NODES"), arg(&args, 2, "THREADS"))
        }
        Some("plan-overhead") => overhead::plan_overhead(arg(&args, 1, "NODES")),
        Some("matmul") => {
            let ty: String = arg(&args, 1, "TYPE");
            match DType::from_name(&ty) {
                Some(t) => matmul::matmul(
                    t,
                    arg(&args, 2, "M"),
                    arg(&args, 3, "N"),
                    arg(&args, 4, "K"),
                    arg(&args, 5, "THREADS"),
                    arg(&args, 6, "REPS"),
                    matmul::Flags { repack, share },
                ),
                None => Err(quantgraph::Error::UnknownType(ty)),
            }
        }
        Some("mul_mat_id") => {
            let ty: String = arg(&args, 1, "TYPE");
            match DType::from_name(&ty) {
                Some(t) => matmul::mul_mat_id(
                    t,
                    arg(&args, 2, "M"),
                    arg(&args, 3, "N"),
                    arg(&args, 4, "K"),
                    arg(&args, 5, "N_EXPERT"),
                    arg(&args, 6, "N_USED"),
                    arg(&args, 7, "THREADS"),
                    arg(&args, 8, "REPS"),
                    repack,
                ),
                None => Err(quantgraph::Error::UnknownType(ty)),
            }
        }
        Some("decode-stream") => {
            let ty: String = arg(&args, 1, "TYPE");
            match DType::from_name(&ty) {
                Some(t) => matmul::decode_stream(
                    t,
                    arg(&args, 2, "M"),
                    arg(&args, 3, "K"),
                    arg(&args, 4, "THREADS"),
                    arg(&args, 5, "REPS"),
                    args.get(6).and_then(|s| s.parse().ok()).unwrap_or(1024),
                ),
                None => Err(quantgraph::Error::UnknownType(ty)),
            }
        }
        Some("op")
            if matches!(
                args.get(1).map(String::as_str),
                Some("conv_2d" | "conv_2d_f16" | "im2col" | "im2col_f16" | "pool_2d")
            ) =>
        {
            ops::vision_op(
                &arg::<String>(&args, 1, "NAME"),
                arg(&args, 2, "THREADS"),
                arg(&args, 3, "REPS"),
            )
        }
        Some("op") => ops::op(
            &arg::<String>(&args, 1, "NAME"),
            arg(&args, 2, "THREADS"),
            arg(&args, 3, "REPS"),
        ),
        Some("train-op") => train::train_op(
            &arg::<String>(&args, 1, "NAME"),
            arg(&args, 2, "THREADS"),
            arg(&args, 3, "REPS"),
        ),
        Some("model") => model::model(
            &arg::<String>(&args, 1, "tiny|large|FILE.gguf"),
            arg(&args, 2, "THREADS"),
            args.get(3).and_then(|s| s.parse().ok()).unwrap_or(512),
            args.get(4).and_then(|s| s.parse().ok()).unwrap_or(16),
            repack,
            model_opts,
        ),
        Some("peak") => {
            let t: usize = arg(&args, 1, "THREADS");
            println!("quantgraph peak threads={t} gflops={:.1}", peaks::fma_peak(t));
            if let Some(g) = peaks::int8_peak(t) {
                println!("quantgraph int8_peak threads={t} gops={g:.1}");
            } else if let Some(g) = peaks::int8_maddubs_peak(t) {
                println!("quantgraph int8_maddubs_peak threads={t} gops={g:.1}");
                if let Some(g) = peaks::int8_maddubs_wide_peak(t) {
                    println!("quantgraph int8_maddubs_wide_peak threads={t} gops={g:.1}");
                }
            }
            if let Some(g) = peaks::amx_peak(t) {
                println!("quantgraph amx_int8_peak threads={t} gops={g:.1}");
            }
            if let Some(g) = peaks::amx_bf16_peak(t) {
                println!("quantgraph amx_bf16_peak threads={t} gflops={g:.1}");
            }
            Ok(())
        }
        Some("bandwidth") => {
            let t: usize = arg(&args, 1, "THREADS");
            println!("quantgraph bandwidth threads={t} gbps={:.1}", peaks::bandwidth(t));
            println!("quantgraph read_bandwidth threads={t} gbps={:.1}", peaks::read_bandwidth(t));
            Ok(())
        }
        Some("vec-dot") => {
            let ty: String = arg(&args, 1, "TYPE");
            match DType::from_name(&ty) {
                Some(t) => {
                    let kernel = args.get(4).is_some_and(|a| a == "--kernel");
                    vec_dot::vec_dot(t, arg(&args, 2, "N"), arg(&args, 3, "REPS"), kernel)
                }
                None => Err(quantgraph::Error::UnknownType(ty)),
            }
        }
        _ => {
            eprintln!(
                "usage: bench node-overhead NODES THREADS | plan-overhead NODES | \
                 matmul TYPE M N K THREADS REPS [--repack] [--share] | \
                 mul_mat_id TYPE M N K N_EXPERT N_USED THREADS REPS [--repack] | \
                 vec-dot TYPE N REPS [--kernel] | op NAME THREADS REPS | \
                 train-op NAME THREADS REPS | bandwidth THREADS | \
                 decode-stream TYPE M K THREADS REPS [TOTAL_MIB] | peak THREADS | model tiny|large|FILE.gguf THREADS [N_PROMPT] [N_GEN] [--ctx N] [--depth D] [--reps R]"
            );
            std::process::exit(2)
        }
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
