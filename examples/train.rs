//! Trains a small perceptron (2 -> 32 -> 3, tanh) with AdamW to tell which of three angular
//! sectors a point of the plane lies in, from 4096 generated points (10% held out), and prints the
//! loss and accuracy of every epoch. With the fixed seeds below the training loss falls from 0.28 (first epoch) below 0.05
//! (0.022 after the 20th).
//!
//! Run with `cargo run --release --example train`.

use quantgraph::opt::{Dataset, Loss, Optimizer, Rng, TrainParams, Trainer};
use quantgraph::{Buffer, CpuBackend, DType, Graph, UnaryOp};

fn main() -> quantgraph::Result<()> {
    const N: usize = 4096;
    const HIDDEN: usize = 32;
    const BATCH: usize = 32;
    const EPOCHS: usize = 20;
    const TARGET: f64 = 0.05;

    // Points in [-1, 1]^2; the class is the sector of their angle (0-120, 120-240, 240-360 deg).
    let mut rng = Rng::new(42);
    let mut data = Vec::with_capacity(2 * N);
    let mut labels = vec![0f32; 3 * N];
    for i in 0..N {
        let (x, y) = (2.0 * rng.next_f32() - 1.0, 2.0 * rng.next_f32() - 1.0);
        data.extend([x, y]);
        let angle = y.atan2(x).rem_euclid(std::f32::consts::TAU);
        let class = ((angle / std::f32::consts::TAU * 3.0) as usize).min(2);
        labels[3 * i + class] = 1.0;
    }
    let mut dataset = Dataset::new(2, 3, data, labels)?;

    // Parameters live in one caller buffer, updated in place by the optimizer.
    let shapes: [&[usize]; 4] = [&[2, HIDDEN], &[HIDDEN], &[HIDDEN, 3], &[3]];
    let total: usize = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
    let weights = Buffer::alloc(total * 4)?;
    let init: Vec<f32> = (0..total).map(|_| rng.next_f32() - 0.5).collect();
    weights.write_f32(0, &init)?;

    let mut g = Graph::new();
    let x = g.input(DType::F32, &[2, BATCH])?;
    let mut p = Vec::new();
    let mut offset = 0;
    for s in shapes {
        let t = g.state(DType::F32, s, &weights, offset)?;
        g.set_param(t)?;
        p.push(t);
        offset += s.iter().product::<usize>() * 4;
    }
    let h = g.mul_mat(p[0], x)?;
    let h = g.add(h, p[1])?;
    let h = g.unary(h, UnaryOp::Tanh)?;
    let logits = g.mul_mat(p[2], h)?;
    let logits = g.add(logits, p[3])?;

    let params = TrainParams::new(Loss::CrossEntropy, Optimizer::adamw(0.01));
    let mut trainer = Trainer::new(g, x, logits, params, &CpuBackend::new()?)?;
    let stats = trainer.fit(&mut dataset, EPOCHS, 0.1, 7, &mut |_, _| {})?;
    for (e, s) in stats.iter().enumerate() {
        let (tl, _) = s.train.loss().unwrap_or_default();
        let (vl, _) = s.eval.loss().unwrap_or_default();
        println!(
            "epoch {:2}: train loss {tl:.4} accuracy {:.3} | held-out loss {vl:.4} accuracy {:.3}",
            e + 1,
            s.train.accuracy().unwrap_or(0.0),
            s.eval.accuracy().unwrap_or(0.0),
        );
    }
    let last = stats.last().and_then(|s| s.train.loss()).map_or(f64::INFINITY, |l| l.0);
    println!("final training loss {last:.4} (target: below {TARGET})");
    if last >= TARGET {
        return Err(quantgraph::Error::InvalidArgument(format!(
            "training loss {last} did not fall below {TARGET}"
        )));
    }
    Ok(())
}
