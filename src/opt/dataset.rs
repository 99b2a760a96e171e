//! Datasets of (datapoint, label) pairs for [`super::Trainer`] (ggml-opt's `ggml_opt_dataset`):
//! F32 rows held in memory, read in batches through an order that [`Dataset::shuffle`] permutes
//! with a seeded generator, so a training run is reproducible.

use crate::error::{Error, Result};

/// A small seeded random generator (SplitMix64) for shuffling: the same seed gives the same
/// order on every platform.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..n` (`n > 0`), by rejection so every value is equally likely.
    pub fn below(&mut self, n: u64) -> u64 {
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    /// A uniform f32 in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Datapoints of `ne_datapoint` F32 values, each with a label of `ne_label` F32 values (a one-hot
/// class for cross-entropy, targets for mean squared error; unused by the mean and sum losses).
///
/// ```
/// use quantgraph::opt::Dataset;
/// let ds = Dataset::new(2, 1, vec![0.0, 1.0, 2.0, 3.0], vec![10.0, 20.0])?;
/// let (mut x, mut y) = (vec![0.0; 2], vec![0.0; 1]);
/// ds.batch(1, 1, &mut x, &mut y)?;
/// assert_eq!((x, y), (vec![2.0, 3.0], vec![20.0]));
/// # Ok::<(), quantgraph::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Dataset {
    ne_datapoint: usize,
    ne_label: usize,
    data: Vec<f32>,
    labels: Vec<f32>,
    /// Batches read datapoints in this order.
    order: Vec<usize>,
}

impl Dataset {
    /// A dataset of `data.len() / ne_datapoint` datapoints; `labels` holds `ne_label` values per
    /// datapoint. `Err` when the lengths do not divide into the same number of datapoints.
    pub fn new(
        ne_datapoint: usize,
        ne_label: usize,
        data: Vec<f32>,
        labels: Vec<f32>,
    ) -> Result<Dataset> {
        if ne_datapoint == 0 || !data.len().is_multiple_of(ne_datapoint) {
            return Err(Error::arg(format!(
                "dataset: {} data values do not split into datapoints of {ne_datapoint}",
                data.len()
            )));
        }
        let n = data.len() / ne_datapoint;
        if labels.len() != n.saturating_mul(ne_label) {
            return Err(Error::arg(format!(
                "dataset: {n} datapoints need {} label values ({ne_label} each), got {}",
                n * ne_label,
                labels.len()
            )));
        }
        Ok(Dataset { ne_datapoint, ne_label, data, labels, order: (0..n).collect() })
    }

    /// Number of datapoints.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// True when the dataset holds no datapoint.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Values per datapoint.
    pub fn ne_datapoint(&self) -> usize {
        self.ne_datapoint
    }

    /// Values per label.
    pub fn ne_label(&self) -> usize {
        self.ne_label
    }

    /// Shuffles the first `n` positions of the batch order (ggml_opt_dataset_shuffle with
    /// `idata = n`; the rest, a held-out split, keeps its place). `n` is clamped to the length.
    pub fn shuffle(&mut self, rng: &mut Rng, n: usize) {
        let n = n.min(self.order.len());
        for i in (1..n).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            self.order.swap(i, j);
        }
    }

    /// Copies batch `ibatch` of `batch_size` datapoints (positions `ibatch * batch_size ..` of the
    /// current order) into `data` and `labels`, which must hold exactly one batch.
    pub fn batch(
        &self,
        ibatch: usize,
        batch_size: usize,
        data: &mut [f32],
        labels: &mut [f32],
    ) -> Result<()> {
        let start = ibatch
            .checked_mul(batch_size)
            .filter(|s| s.checked_add(batch_size).is_some_and(|end| end <= self.order.len()));
        let Some(start) = start else {
            return Err(Error::arg(format!(
                "dataset: batch {ibatch} of {batch_size} datapoints is past the {} datapoints",
                self.order.len()
            )));
        };
        if data.len() != batch_size * self.ne_datapoint
            || labels.len() != batch_size * self.ne_label
        {
            return Err(Error::arg(format!(
                "dataset: a batch of {batch_size} needs {} data and {} label values, got {} and {}",
                batch_size * self.ne_datapoint,
                batch_size * self.ne_label,
                data.len(),
                labels.len()
            )));
        }
        let (nd, nl) = (self.ne_datapoint, self.ne_label);
        for (k, &i) in self.order[start..start + batch_size].iter().enumerate() {
            data[k * nd..(k + 1) * nd].copy_from_slice(&self.data[i * nd..(i + 1) * nd]);
            labels[k * nl..(k + 1) * nl].copy_from_slice(&self.labels[i * nl..(i + 1) * nl]);
        }
        Ok(())
    }
}
