//! Training loops (ggml-opt): a [`Trainer`] turns a model graph whose parameters are marked with
//! [`Graph::set_param`] into three plans: evaluation (forward and loss), gradients (forward,
//! loss, [`Graph::build_backward`], gradients summed into accumulators), and the optimizer step
//! (AdamW or SGD on every parameter, then the accumulators cleared). [`Trainer::epoch`] and
//! [`Trainer::fit`] walk a [`Dataset`] in batches with seeded shuffling, accumulate gradients
//! over several batches, evaluate a held-out split and report progress through a callback.
//!
//! Parameters are `State` tensors ([`Graph::state`]) in buffers the caller owns: the optimizer
//! updates them in place, so the trained weights are read back from those buffers.

mod dataset;

pub use dataset::{Dataset, Rng};

use crate::backend::{Buffer, CpuBackend};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Graph, Leaf, TensorId};
use crate::plan::Plan;

/// What the trainer minimises (ggml's `enum ggml_opt_loss_type`), from the model's outputs
/// `[ne_label, batch]` and the labels of the same shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Loss {
    /// The mean of the outputs (labels unused).
    Mean,
    /// The sum of the outputs (labels unused).
    Sum,
    /// Cross-entropy of the softmax of each output column against the label column (one-hot or
    /// a distribution), averaged over the batch; the accuracy compares argmaxes.
    CrossEntropy,
    /// The mean of the squared differences between outputs and labels.
    MeanSquaredError,
}

/// An optimizer with its hyperparameters (ggml's `ggml_opt_optimizer_params`).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Optimizer {
    /// AdamW: `m = beta1 m + (1 - beta1) g`, `v = beta2 v + (1 - beta2) g^2`,
    /// `w = w (1 - alpha wd) - alpha m^ / (sqrt(v^) + eps)` with bias-corrected `m^`, `v^`.
    AdamW {
        /// Learning rate, > 0.
        alpha: f32,
        /// First moment decay, in [0, 1).
        beta1: f32,
        /// Second moment decay, in [0, 1).
        beta2: f32,
        /// Added to the root of the second moment, >= 0.
        eps: f32,
        /// Weight decay, in [0, 1].
        wd: f32,
    },
    /// Stochastic gradient descent with weight decay: `w = w (1 - alpha wd) - alpha g`.
    Sgd {
        /// Learning rate, > 0.
        alpha: f32,
        /// Weight decay, in [0, 1].
        wd: f32,
    },
}

impl Optimizer {
    /// AdamW with ggml's defaults except the learning rate: beta1 0.9, beta2 0.999, eps 1e-8,
    /// no weight decay.
    pub fn adamw(alpha: f32) -> Optimizer {
        Optimizer::AdamW { alpha, beta1: 0.9, beta2: 0.999, eps: 1e-8, wd: 0.0 }
    }

    /// SGD without weight decay.
    pub fn sgd(alpha: f32) -> Optimizer {
        Optimizer::Sgd { alpha, wd: 0.0 }
    }

    fn check(&self) -> Result<()> {
        let ok = match *self {
            Optimizer::AdamW { alpha, beta1, beta2, eps, wd } => {
                alpha > 0.0
                    && alpha.is_finite()
                    && (0.0..1.0).contains(&beta1)
                    && (0.0..1.0).contains(&beta2)
                    && eps >= 0.0
                    && eps.is_finite()
                    && (0.0..=1.0).contains(&wd)
            }
            Optimizer::Sgd { alpha, wd } => {
                alpha > 0.0 && alpha.is_finite() && (0.0..=1.0).contains(&wd)
            }
        };
        if ok {
            Ok(())
        } else {
            Err(Error::param(
                "optimizer",
                format!(
                    "{self:?}: need alpha > 0, betas in [0, 1), eps >= 0 and weight decay in [0, 1]"
                ),
            ))
        }
    }
}

/// Settings of a [`Trainer`].
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct TrainParams {
    /// The loss.
    pub loss: Loss,
    /// The optimizer and its hyperparameters.
    pub optimizer: Optimizer,
    /// Batches whose gradients are averaged before each optimizer step (ggml's `opt_period`),
    /// >= 1.
    pub grad_accumulation: usize,
}

impl TrainParams {
    /// `loss` minimised by `optimizer`, one optimizer step per batch.
    pub fn new(loss: Loss, optimizer: Optimizer) -> TrainParams {
        TrainParams { loss, optimizer, grad_accumulation: 1 }
    }

    /// Averages the gradients of `n` batches before each optimizer step.
    pub fn grad_accumulation(mut self, n: usize) -> TrainParams {
        self.grad_accumulation = n;
        self
    }
}

/// The result of one batch.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct BatchResult {
    /// The batch's loss (not divided by the accumulation count).
    pub loss: f32,
    /// Datapoints whose output argmax equals the label's (cross-entropy only).
    pub ncorrect: Option<u64>,
    /// True when this batch completed an accumulation period and the optimizer stepped.
    pub stepped: bool,
}

/// Losses and accuracy over the batches of an epoch (ggml's `ggml_opt_result`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EpochResult {
    /// The loss of every batch, in order.
    pub losses: Vec<f32>,
    /// Datapoints seen.
    pub ndata: usize,
    /// Correct argmax predictions (cross-entropy only).
    pub ncorrect: Option<u64>,
}

impl EpochResult {
    fn push(&mut self, r: &BatchResult, batch: usize) {
        self.losses.push(r.loss);
        self.ndata += batch;
        self.ncorrect = match (self.ncorrect, r.ncorrect) {
            (Some(a), Some(b)) => Some(a + b),
            (None, Some(b)) if self.losses.len() == 1 => Some(b),
            _ => None,
        };
    }

    /// The mean batch loss and its standard error (`None` without batches).
    pub fn loss(&self) -> Option<(f64, f64)> {
        let n = self.losses.len();
        if n == 0 {
            return None;
        }
        let mean = self.losses.iter().map(|&l| l as f64).sum::<f64>() / n as f64;
        let var = self.losses.iter().map(|&l| (l as f64 - mean).powi(2)).sum::<f64>()
            / (n.max(2) - 1) as f64;
        Some((mean, (var / n as f64).sqrt()))
    }

    /// The fraction of correct predictions (`None` without them).
    pub fn accuracy(&self) -> Option<f64> {
        self.ncorrect.filter(|_| self.ndata > 0).map(|c| c as f64 / self.ndata as f64)
    }
}

/// Where an epoch is, for progress callbacks.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Progress<'a> {
    /// Training batches (true) or held-out evaluation (false).
    pub train: bool,
    /// Batches done in this part of the epoch.
    pub batch: usize,
    /// Batches in this part of the epoch.
    pub n_batches: usize,
    /// The results so far in this part.
    pub result: &'a EpochResult,
}

/// Per-epoch summary returned by [`Trainer::fit`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct EpochStats {
    /// Results on the training batches.
    pub train: EpochResult,
    /// Results on the held-out batches.
    pub eval: EpochResult,
}

/// One parameter and its optimizer state.
struct ParamSlot {
    id: TensorId,
    ne: [usize; 4],
    buffer: Buffer,
    offset: usize,
}

/// Trains the parameters of a model graph (ggml-opt's `ggml_opt_context`).
///
/// The model graph has an F32 input of `ne_datapoint * batch` values (the data of `batch`
/// datapoints, one after the other) and an F32 output `[ne_label, batch]`; its parameters are
/// F32 `State` tensors marked with [`Graph::set_param`].
///
/// ```
/// use quantgraph::opt::{Loss, Optimizer, TrainParams, Trainer};
/// use quantgraph::{Buffer, CpuBackend, DType, Graph};
/// // Fit y = w * x to y = 3x.
/// let w_buf = Buffer::alloc(4)?;
/// let mut g = Graph::new();
/// let x = g.input(DType::F32, &[1, 4])?;
/// let w = g.state(DType::F32, &[1], &w_buf, 0)?;
/// g.set_param(w)?;
/// let y = g.mul(x, w)?;
/// let params = TrainParams::new(Loss::MeanSquaredError, Optimizer::sgd(0.1));
/// let mut t = Trainer::new(g, x, y, params, &CpuBackend::with_threads(1)?)?;
/// let data = [1.0f32, 2.0, -1.0, 0.5];
/// let labels = data.map(|v| 3.0 * v);
/// for _ in 0..50 {
///     t.train_batch(&data, &labels)?;
/// }
/// let mut w_now = [0u8; 4];
/// w_buf.read(0, &mut w_now)?;
/// assert!((f32::from_le_bytes(w_now) - 3.0).abs() < 1e-3);
/// # Ok::<(), quantgraph::Error>(())
/// ```
pub struct Trainer {
    eval: Plan,
    grad: Plan,
    step: Plan,
    inputs: TensorId,
    labels: Option<TensorId>,
    loss: TensorId,
    ncorrect: Option<TensorId>,
    step_params: TensorId,
    params: TrainParams,
    slots: Vec<ParamSlot>,
    /// Optimizer steps taken.
    iter: u64,
    /// Batches accumulated since the last step.
    pending: usize,
    batch: usize,
    ne_datapoint: usize,
    ne_label: usize,
}

impl Trainer {
    /// Builds the evaluation, gradient and optimizer plans for `model` on `backend`. `inputs` and
    /// `outputs` are the model's input and output tensors; the parameters are the tensors marked
    /// with [`Graph::set_param`], each an F32 state tensor.
    pub fn new(
        model: Graph,
        inputs: TensorId,
        outputs: TensorId,
        params: TrainParams,
        backend: &CpuBackend,
    ) -> Result<Trainer> {
        const OP: &str = "trainer";
        params.optimizer.check()?;
        if params.grad_accumulation == 0 {
            return Err(Error::param(OP, "grad_accumulation must be at least 1"));
        }
        let mut g = model;
        let (ti, to) = (g.get(OP, inputs)?.clone(), g.get(OP, outputs)?.clone());
        if ti.dtype != DType::F32 || to.dtype != DType::F32 {
            return Err(Error::ty(
                OP,
                format!(
                    "inputs {} and outputs {} must be F32",
                    ti.describe(inputs),
                    to.describe(outputs)
                ),
            ));
        }
        if !matches!(ti.leaf, Leaf::Input) {
            return Err(Error::arg(format!(
                "{OP}: inputs {} must be an input tensor (Graph::input)",
                ti.describe(inputs)
            )));
        }
        let (ne_label, batch) = (to.ne[0], to.ne[1]);
        if to.ne[2] * to.ne[3] != 1 || batch == 0 || !ti.nelements().is_multiple_of(batch) {
            return Err(Error::shape(
                OP,
                format!(
                    "outputs {} must be [ne_label, batch] and inputs {} hold batch datapoints",
                    to.describe(outputs),
                    ti.describe(inputs)
                ),
            ));
        }
        let ne_datapoint = ti.nelements() / batch;
        let mut slots = Vec::new();
        for &p in g.params() {
            let t = g.t(p);
            match &t.leaf {
                Leaf::State { buffer, offset } => slots.push(ParamSlot {
                    id: p,
                    ne: t.ne,
                    buffer: buffer.clone(),
                    offset: *offset,
                }),
                _ => {
                    return Err(Error::arg(format!(
                        "{OP}: parameter {} must be a state tensor (Graph::state) so the optimizer can update it",
                        t.describe(p)
                    )));
                }
            }
        }
        if slots.is_empty() {
            return Err(Error::arg(format!("{OP}: no parameters (mark them with set_param)")));
        }

        // Loss, as ggml-opt builds it; the reported loss is not divided by the period.
        let period = params.grad_accumulation as f32;
        let n_out = to.nelements() as f32;
        let (labels, loss) = match params.loss {
            Loss::Mean => {
                let s = g.sum(outputs)?;
                (None, g.scale(s, 1.0 / n_out)?)
            }
            Loss::Sum => (None, g.sum(outputs)?),
            Loss::CrossEntropy => {
                let l = g.input(DType::F32, &[ne_label, batch])?;
                (Some(l), g.cross_entropy_loss(outputs, l)?)
            }
            Loss::MeanSquaredError => {
                let l = g.input(DType::F32, &[ne_label, batch])?;
                let d = g.sub(outputs, l)?;
                let d = g.sqr(d)?;
                let s = g.sum(d)?;
                (Some(l), g.scale(s, 1.0 / n_out)?)
            }
        };
        g.set_name(loss, "loss")?;
        g.set_output(loss)?;
        let ncorrect = match (params.loss, labels) {
            (Loss::CrossEntropy, Some(l)) => {
                let pred = g.argmax(outputs)?;
                let want = g.argmax(l)?;
                let c = g.count_equal(pred, want)?;
                g.set_output(c)?;
                Some(c)
            }
            _ => None,
        };
        let eval = Plan::new(g.clone(), backend)?;

        // Gradients, summed into accumulators that live next to the optimizer moments.
        let scaled = if params.grad_accumulation > 1 { g.scale(loss, 1.0 / period)? } else { loss };
        g.set_loss(scaled)?;
        g.build_backward()?;
        let mut step_graph = Graph::new();
        let n_state = match params.optimizer {
            Optimizer::AdamW { .. } => 3,
            Optimizer::Sgd { .. } => 1,
        };
        let step_params = step_graph.input(DType::F32, &[if n_state == 3 { 7 } else { 2 }])?;
        for slot in &slots {
            let nbytes: usize = slot.ne.iter().product::<usize>() * 4;
            let state = Buffer::alloc(nbytes * n_state)?;
            let acc = g.state(DType::F32, &slot.ne, &state, 0)?;
            let grad = g.grad(slot.id).ok_or_else(|| {
                Error::arg(format!(
                    "{OP}: the loss does not depend on parameter {}",
                    g.t(slot.id).describe(slot.id)
                ))
            })?;
            let sum = g.add(acc, grad)?;
            g.cpy(sum, acc)?;

            let w = step_graph.state(DType::F32, &slot.ne, &slot.buffer, slot.offset)?;
            let acc = step_graph.state(DType::F32, &slot.ne, &state, 0)?;
            match params.optimizer {
                Optimizer::AdamW { .. } => {
                    let m = step_graph.state(DType::F32, &slot.ne, &state, nbytes)?;
                    let v = step_graph.state(DType::F32, &slot.ne, &state, 2 * nbytes)?;
                    step_graph.opt_step_adamw(w, acc, m, v, step_params)?;
                }
                Optimizer::Sgd { .. } => {
                    step_graph.opt_step_sgd(w, acc, step_params)?;
                }
            }
            let zero = step_graph.fill(acc, 0.0)?;
            step_graph.cpy(zero, acc)?;
        }
        let grad = Plan::new(g, backend)?;
        let step = Plan::new(step_graph, backend)?;
        Ok(Trainer {
            eval,
            grad,
            step,
            inputs,
            labels,
            loss,
            ncorrect,
            step_params,
            params,
            slots,
            iter: 0,
            pending: 0,
            batch,
            ne_datapoint,
            ne_label,
        })
    }

    /// Datapoints per batch (the outputs' `ne[1]`).
    pub fn batch_size(&self) -> usize {
        self.batch
    }

    /// Optimizer steps taken so far.
    pub fn steps(&self) -> u64 {
        self.iter
    }

    /// The current settings.
    pub fn params(&self) -> &TrainParams {
        &self.params
    }

    /// Changes the hyperparameters for the next steps (a learning-rate schedule); the optimizer
    /// kind (AdamW or SGD) stays the one the trainer was built with.
    pub fn set_optimizer(&mut self, optimizer: Optimizer) -> Result<()> {
        optimizer.check()?;
        if std::mem::discriminant(&optimizer) != std::mem::discriminant(&self.params.optimizer) {
            return Err(Error::param(
                "optimizer",
                format!(
                    "the trainer was built for {:?}; {optimizer:?} is another kind",
                    self.params.optimizer
                ),
            ));
        }
        self.params.optimizer = optimizer;
        Ok(())
    }

    fn check_batch(&self, data: &[f32], labels: &[f32]) -> Result<()> {
        let need_labels =
            if self.labels.is_some() { self.batch * self.ne_label } else { labels.len() };
        if data.len() != self.batch * self.ne_datapoint || labels.len() != need_labels {
            return Err(Error::arg(format!(
                "trainer: a batch is {} data values and {} label values, got {} and {}",
                self.batch * self.ne_datapoint,
                self.batch * self.ne_label,
                data.len(),
                labels.len()
            )));
        }
        Ok(())
    }

    /// Sets a batch on `plan` (the eval or gradient plan), computes, and reads loss and count.
    fn run(&mut self, train: bool, data: &[f32], labels: &[f32]) -> Result<(f32, Option<u64>)> {
        self.check_batch(data, labels)?;
        let plan = if train { &mut self.grad } else { &mut self.eval };
        plan.set_input(self.inputs, data)?;
        if let Some(l) = self.labels {
            plan.set_input(l, labels)?;
        }
        plan.compute()?;
        let loss = plan.output::<f32>(self.loss)?[0];
        let ncorrect = match self.ncorrect {
            Some(c) => Some(plan.output::<i64>(c)?[0].max(0) as u64),
            None => None,
        };
        Ok((loss, ncorrect))
    }

    /// Forward pass and loss of one batch, parameters unchanged.
    pub fn eval_batch(&mut self, data: &[f32], labels: &[f32]) -> Result<BatchResult> {
        let (loss, ncorrect) = self.run(false, data, labels)?;
        Ok(BatchResult { loss, ncorrect, stepped: false })
    }

    /// Forward and backward pass of one batch; its gradients are added to the accumulators, and
    /// after every `grad_accumulation` batches the optimizer updates the parameters.
    pub fn train_batch(&mut self, data: &[f32], labels: &[f32]) -> Result<BatchResult> {
        let (loss, ncorrect) = self.run(true, data, labels)?;
        self.pending += 1;
        let stepped = self.pending == self.params.grad_accumulation;
        if stepped {
            self.optimizer_step()?;
        }
        Ok(BatchResult { loss, ncorrect, stepped })
    }

    fn optimizer_step(&mut self) -> Result<()> {
        let t = (self.iter + 1) as i32;
        let values: Vec<f32> = match self.params.optimizer {
            Optimizer::AdamW { alpha, beta1, beta2, eps, wd } => {
                let b1h = 1.0 / (1.0 - beta1.powi(t));
                let b2h = 1.0 / (1.0 - beta2.powi(t));
                vec![alpha, beta1, beta2, eps, wd, b1h, b2h]
            }
            Optimizer::Sgd { alpha, wd } => vec![alpha, wd],
        };
        self.step.set_input(self.step_params, &values)?;
        self.step.compute()?;
        self.iter += 1;
        self.pending = 0;
        Ok(())
    }

    /// One pass over `dataset` in its current order (ggml_opt_epoch): datapoints before
    /// `split` train (whole accumulation periods of batches), the rest are evaluated; results go
    /// to `train` and `eval`, and `progress` is called after every batch. Datapoints that do not
    /// fill a batch (or a period) are left out.
    pub fn epoch(
        &mut self,
        dataset: &Dataset,
        split: usize,
        train: &mut EpochResult,
        eval: &mut EpochResult,
        progress: &mut dyn FnMut(&Progress<'_>),
    ) -> Result<()> {
        if dataset.ne_datapoint() != self.ne_datapoint
            || (self.labels.is_some() && dataset.ne_label() != self.ne_label)
        {
            return Err(Error::arg(format!(
                "trainer: the model takes datapoints of {} values with labels of {}, the dataset has {} and {}",
                self.ne_datapoint,
                self.ne_label,
                dataset.ne_datapoint(),
                dataset.ne_label()
            )));
        }
        let split = split.min(dataset.len());
        let period = self.params.grad_accumulation;
        let n_train = split / self.batch / period * period;
        let first_eval = split.div_ceil(self.batch);
        let n_eval = (dataset.len() / self.batch).saturating_sub(first_eval);
        let mut data = vec![0f32; self.batch * self.ne_datapoint];
        let mut labels = vec![0f32; self.batch * dataset.ne_label()];
        for i in 0..n_train {
            dataset.batch(i, self.batch, &mut data, &mut labels)?;
            let r = self.train_batch(&data, &labels)?;
            train.push(&r, self.batch);
            progress(&Progress { train: true, batch: i + 1, n_batches: n_train, result: train });
        }
        for i in 0..n_eval {
            dataset.batch(first_eval + i, self.batch, &mut data, &mut labels)?;
            let r = self.eval_batch(&data, &labels)?;
            eval.push(&r, self.batch);
            progress(&Progress { train: false, batch: i + 1, n_batches: n_eval, result: eval });
        }
        Ok(())
    }

    /// ggml_opt_fit: `epochs` epochs over `dataset`, holding out the last `val_split` fraction
    /// (0 to 1) for evaluation and shuffling the training part before every epoch with a
    /// generator seeded by `seed`. Returns each epoch's results.
    pub fn fit(
        &mut self,
        dataset: &mut Dataset,
        epochs: usize,
        val_split: f32,
        seed: u64,
        progress: &mut dyn FnMut(usize, &Progress<'_>),
    ) -> Result<Vec<EpochStats>> {
        if !(0.0..1.0).contains(&val_split) {
            return Err(Error::param("fit", format!("val_split = {val_split} must be in [0, 1)")));
        }
        let step = self.batch * self.params.grad_accumulation;
        let n_steps = dataset.len() / step;
        let split = ((1.0 - val_split as f64) * n_steps as f64) as usize * step;
        let mut rng = Rng::new(seed);
        let mut out = Vec::with_capacity(epochs);
        for e in 0..epochs {
            dataset.shuffle(&mut rng, split);
            let (mut train, mut eval) = (EpochResult::default(), EpochResult::default());
            self.epoch(dataset, split, &mut train, &mut eval, &mut |p| progress(e, p))?;
            out.push(EpochStats { train, eval });
        }
        Ok(out)
    }

    /// Reads the current values of parameter `id` (one of the model's parameters).
    pub fn param_values(&self, id: TensorId) -> Result<Vec<f32>> {
        let slot = self.slots.iter().find(|s| s.id == id).ok_or_else(|| {
            Error::arg(format!("trainer: tensor {} is not a parameter", id.index()))
        })?;
        let n: usize = slot.ne.iter().product();
        let mut bytes = vec![0u8; n * 4];
        slot.buffer.read(slot.offset, &mut bytes)?;
        Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }
}
