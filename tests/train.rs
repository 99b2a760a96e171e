//! The training loop: a tiny perceptron trained a few steps lowers its loss, gives bitwise the
//! same parameters and losses on 1 and 2 threads, accumulating gradients over batches matches
//! one larger batch, SGD takes exactly the step its formula gives, and seeded shuffling is
//! reproducible.

use quantgraph::opt::{Dataset, EpochResult, Loss, Optimizer, Rng, TrainParams, Trainer};
use quantgraph::testdata::uniform;
use quantgraph::{Buffer, CpuBackend, DType, Graph, TensorId, UnaryOp};

const NIN: usize = 4;
const NHID: usize = 6;
const NOUT: usize = 3;

struct Mlp {
    g: Graph,
    x: TensorId,
    y: TensorId,
    params: Vec<TensorId>,
}

/// x [NIN, batch] -> tanh(W1 x + b1) -> W2 h + b2 [NOUT, batch], parameters in one buffer.
fn mlp(batch: usize, seed: u64) -> Mlp {
    let shapes: [&[usize]; 4] = [&[NIN, NHID], &[NHID], &[NHID, NOUT], &[NOUT]];
    let total: usize = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
    let buf = Buffer::alloc(total * 4).unwrap();
    buf.write_f32(0, &uniform(total, seed, -0.5, 0.5)).unwrap();
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[NIN, batch]).unwrap();
    let mut params = Vec::new();
    let mut off = 0;
    for s in shapes {
        let p = g.state(DType::F32, s, &buf, off).unwrap();
        g.set_param(p).unwrap();
        params.push(p);
        off += s.iter().product::<usize>() * 4;
    }
    let h = g.mul_mat(params[0], x).unwrap();
    let h = g.add(h, params[1]).unwrap();
    let h = g.unary(h, UnaryOp::Tanh).unwrap();
    let y = g.mul_mat(params[2], h).unwrap();
    let y = g.add(y, params[3]).unwrap();
    Mlp { g, x, y, params }
}

/// Datapoints whose class is the index of the largest of three fixed linear features.
fn classes(n: usize, seed: u64) -> Dataset {
    let data = uniform(n * NIN, seed, -1.0, 1.0);
    let mut labels = vec![0f32; n * NOUT];
    for i in 0..n {
        let x = &data[i * NIN..(i + 1) * NIN];
        let f = [x[0] + x[1], x[2] - x[0], x[3] * 1.5 - x[1]];
        let c = (0..NOUT).max_by(|&a, &b| f[a].total_cmp(&f[b])).unwrap();
        labels[i * NOUT + c] = 1.0;
    }
    Dataset::new(NIN, NOUT, data, labels).unwrap()
}

fn train_run(
    threads: usize,
    params: TrainParams,
    batch: usize,
    epochs: usize,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let m = mlp(batch, 7);
    let backend = CpuBackend::with_threads(threads).unwrap();
    let mut t = Trainer::new(m.g, m.x, m.y, params, &backend).unwrap();
    let mut ds = classes(64, 3);
    let stats = t.fit(&mut ds, epochs, 0.0, 11, &mut |_, _| {}).unwrap();
    let losses = stats.iter().flat_map(|s| s.train.losses.clone()).collect();
    let values = m.params.iter().map(|&p| t.param_values(p).unwrap()).collect();
    (losses, values)
}

#[test]
fn tiny_model_loss_decreases_and_threads_agree() {
    let params = TrainParams::new(Loss::CrossEntropy, Optimizer::adamw(0.05));
    let (l1, p1) = train_run(1, params, 8, 6);
    let (l2, p2) = train_run(2, params, 8, 6);
    assert_eq!(l1.len(), 6 * 8);
    let first: f32 = l1[..8].iter().sum::<f32>() / 8.0;
    let last: f32 = l1[l1.len() - 8..].iter().sum::<f32>() / 8.0;
    assert!(last < 0.6 * first, "loss {first} -> {last} did not fall");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&l1), bits(&l2), "losses differ between 1 and 2 threads");
    for (a, b) in p1.iter().zip(&p2) {
        assert_eq!(bits(a), bits(b), "parameters differ between 1 and 2 threads");
    }
}

#[test]
fn accumulating_two_half_batches_matches_one_batch() {
    // Mean-type losses averaged over a period of 2 batches of 4 give the gradient of one batch of
    // 8 with the same datapoints, so SGD lands on the same parameters (up to rounding).
    let sgd = Optimizer::sgd(0.5);
    let (_, whole) = train_run(1, TrainParams::new(Loss::MeanSquaredError, sgd), 8, 2);
    let accumulated = TrainParams::new(Loss::MeanSquaredError, sgd).grad_accumulation(2);
    let (losses, halves) = train_run(1, accumulated, 4, 2);
    assert_eq!(losses.len(), 2 * 16);
    let mut moved = 0f32;
    let start = mlp(1, 7);
    let before: Vec<f32> = {
        let t = Trainer::new(
            start.g,
            start.x,
            start.y,
            TrainParams::new(Loss::Sum, sgd),
            &CpuBackend::with_threads(1).unwrap(),
        )
        .unwrap();
        t.param_values(start.params[0]).unwrap()
    };
    for (a, b) in whole[0].iter().zip(&before) {
        moved = moved.max((a - b).abs());
    }
    assert!(moved > 1e-3, "training did not move the parameters");
    for (a, b) in whole.iter().zip(&halves) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5, "{x} vs {y}");
        }
    }
}

#[test]
fn sgd_and_sum_loss_take_the_exact_step() {
    // loss = sum(w * x): the gradient is sum(x), so one step moves w by -alpha * sum(x) after
    // weight decay.
    let buf = Buffer::alloc(4).unwrap();
    buf.write_f32(0, &[2.0]).unwrap();
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[1, 4]).unwrap();
    let w = g.state(DType::F32, &[1], &buf, 0).unwrap();
    g.set_param(w).unwrap();
    let y = g.mul(x, w).unwrap();
    let opt = Optimizer::Sgd { alpha: 0.25, wd: 0.5 };
    let mut t = Trainer::new(
        g,
        x,
        y,
        TrainParams::new(Loss::Sum, opt),
        &CpuBackend::with_threads(1).unwrap(),
    )
    .unwrap();
    let r = t.train_batch(&[1.0, 2.0, 3.0, 4.0], &[]).unwrap();
    assert_eq!(r.loss, 20.0);
    assert!(r.stepped);
    let want = 2.0 * (1.0 - 0.25 * 0.5) - 0.25 * 10.0;
    assert_eq!(t.param_values(w).unwrap(), vec![want]);
    // Mean divides by the element count.
    let r = t.eval_batch(&[1.0, 1.0, 1.0, 1.0], &[]).unwrap();
    assert_eq!(r.loss, 4.0 * want);
    assert!(t.set_optimizer(Optimizer::adamw(0.1)).is_err(), "the kind is fixed");
    t.set_optimizer(Optimizer::sgd(0.5)).unwrap();
    assert!(t.train_batch(&[1.0; 3], &[]).is_err(), "wrong batch size");
}

#[test]
fn mean_loss_and_bad_models_are_checked() {
    // loss = mean(w * x) over 4 values: gradient mean(x) = 2.5; one SGD step of 0.1.
    let buf = Buffer::alloc(4).unwrap();
    buf.write_f32(0, &[1.0]).unwrap();
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[1, 4]).unwrap();
    let w = g.state(DType::F32, &[1], &buf, 0).unwrap();
    g.set_param(w).unwrap();
    let y = g.mul(x, w).unwrap();
    let be = CpuBackend::with_threads(1).unwrap();
    let mut t =
        Trainer::new(g.clone(), x, y, TrainParams::new(Loss::Mean, Optimizer::sgd(0.1)), &be)
            .unwrap();
    let r = t.train_batch(&[1.0, 2.0, 3.0, 4.0], &[]).unwrap();
    assert_eq!(r.loss, 2.5);
    assert_eq!(t.param_values(w).unwrap(), vec![1.0 - 0.1 * 2.5]);

    // A parameter outside a state buffer cannot be updated; bad hyperparameters are refused.
    let mut g2 = Graph::new();
    let x2 = g2.input(DType::F32, &[1, 4]).unwrap();
    let w2 = g2.input(DType::F32, &[1]).unwrap();
    g2.set_param(w2).unwrap();
    let y2 = g2.mul(x2, w2).unwrap();
    let e = Trainer::new(g2, x2, y2, TrainParams::new(Loss::Sum, Optimizer::sgd(0.1)), &be);
    assert!(e.err().unwrap().to_string().contains("state tensor"));
    let bad = Optimizer::AdamW { alpha: 0.1, beta1: 1.5, beta2: 0.999, eps: 1e-8, wd: 0.0 };
    assert!(Trainer::new(g.clone(), x, y, TrainParams::new(Loss::Sum, bad), &be).is_err());
    let zero = TrainParams::new(Loss::Sum, Optimizer::sgd(0.1)).grad_accumulation(0);
    assert!(Trainer::new(g, x, y, zero, &be).is_err());
}

#[test]
fn held_out_split_and_progress() {
    let m = mlp(8, 5);
    let params = TrainParams::new(Loss::CrossEntropy, Optimizer::adamw(0.01));
    let mut t = Trainer::new(m.g, m.x, m.y, params, &CpuBackend::with_threads(1).unwrap()).unwrap();
    let mut ds = classes(64, 9);
    let mut calls = (0, 0);
    let stats = t
        .fit(&mut ds, 2, 0.25, 1, &mut |_, p| {
            if p.train {
                calls.0 += 1;
            } else {
                calls.1 += 1;
            }
        })
        .unwrap();
    assert_eq!(calls, (2 * 6, 2 * 2));
    assert_eq!(stats[1].train.ndata, 48);
    assert_eq!(stats[1].eval.ndata, 16);
    let acc = stats[1].eval.accuracy().unwrap();
    assert!((0.0..=1.0).contains(&acc));
    assert_eq!(t.steps(), 12);
    let mut e = EpochResult::default();
    assert!(e.loss().is_none());
    t.epoch(&ds, 0, &mut EpochResult::default(), &mut e, &mut |_| {}).unwrap();
    assert_eq!(e.losses.len(), 8, "split 0: everything is evaluated");
}

#[test]
fn seeded_shuffle_is_a_reproducible_permutation() {
    let n = 50;
    let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let make = || Dataset::new(1, 1, data.clone(), data.clone()).unwrap();
    let order = |ds: &Dataset| {
        let (mut x, mut y) = (vec![0f32; n], vec![0f32; n]);
        ds.batch(0, n, &mut x, &mut y).unwrap();
        assert_eq!(x, y, "data and labels move together");
        x
    };
    let (mut a, mut b, mut c) = (make(), make(), make());
    a.shuffle(&mut Rng::new(3), n);
    b.shuffle(&mut Rng::new(3), n);
    c.shuffle(&mut Rng::new(4), 40);
    assert_eq!(order(&a), order(&b));
    assert_ne!(order(&a), data);
    let mut sorted = order(&a);
    sorted.sort_by(f32::total_cmp);
    assert_eq!(sorted, data);
    assert_eq!(order(&c)[40..], data[40..], "the held-out tail keeps its place");
    assert!(Dataset::new(3, 1, vec![0.0; 7], vec![0.0; 2]).is_err());
}
