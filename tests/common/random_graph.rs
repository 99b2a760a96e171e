//! Random graphs from bytes. [`run_case`] reads any byte string as a sequence of `Graph` builder
//! calls (leaves and caller buffers, views with arbitrary offsets and strides, and ops with
//! their shapes and parameters), plans the graph three times on one SIMD tier (one thread, two
//! threads, and two threads with guard bytes around every tensor), computes each plan on the same
//! inputs and checks that the three agree: the same `Ok` or `Err` at every stage, bitwise equal
//! outputs and state buffers, no guard byte overwritten and no op panicking inside a worker.
//!
//! Every byte string is a valid case; a builder call the graph refuses is recorded and skipped.
//! Shared by tests/random_graphs.rs (proptest) and fuzz/fuzz_targets/graph_builder.rs (cargo fuzz):
//! a returned `Err` or a panic is a finding. Only the public API is used.

use quantgraph::kernels::Isa;
use quantgraph::{
    Buffer, BufferType, CpuBackend, CpuRepackBufferType, DType, Error, FlashAttnParams, Graph,
    Plan, RopeMode, RopeParams, SortOrder, TensorId, TriType, UnaryOp,
};
use std::sync::{Arc, Mutex, OnceLock};

#[path = "lists.rs"]
mod lists;
use lists::{GLU_OPS, KV_TYPES, UNARY_PLAIN, XIELU};

/// The builder calls of a case and their results, in order, then the plan and compute stages
/// (shared with the caller so that it survives a panic or a hang).
pub type Trace = Arc<Mutex<Vec<String>>>;

/// Most builder calls read from one byte string.
pub const MAX_CALLS: usize = 32;
/// Graphs whose largest tensor has more elements than this are built and, when a tensor is too
/// big to ever allocate, planned, but not computed.
const MAX_COMPUTE_ELEMS: usize = 1 << 18;
/// Nor are graphs with a tensor of more rows than this (empty ones included).
const MAX_COMPUTE_ROWS: usize = 1 << 22;
/// Inputs above this size get no data.
const MAX_INPUT_BYTES: usize = 1 << 21;
/// Bytes of guard around every tensor of the guarded plan.
const GUARD: usize = 64;

/// What one case reached, for the counts a run prints.
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcome {
    /// Builder calls made.
    pub calls: usize,
    /// Builder calls that returned `Ok`.
    pub calls_ok: usize,
    /// `Plan::new` ran.
    pub planned: bool,
    /// `Plan::new` returned `Ok`.
    pub plan_ok: bool,
    /// `compute` ran.
    pub computed: bool,
    /// `compute` returned `Ok` (on all three plans).
    pub compute_ok: bool,
}

/// Tiers this CPU runs, each with a one-thread and a two-thread backend.
fn backends() -> &'static [(Isa, CpuBackend, CpuBackend)] {
    static B: OnceLock<Vec<(Isa, CpuBackend, CpuBackend)>> = OnceLock::new();
    B.get_or_init(|| {
        Isa::ALL
            .into_iter()
            .filter(|i| i.is_supported())
            .map(|i| (i, CpuBackend::with_isa(1, i).unwrap(), CpuBackend::with_isa(2, i).unwrap()))
            .collect()
    })
}

/// Appends to the trace; with `QG_TRACE` set, prints the line at once too (a case that aborts the
/// process, as a failed precondition check of the standard library does, leaves no trace else).
fn push(t: &Trace, line: String) {
    static LIVE: OnceLock<bool> = OnceLock::new();
    if *LIVE.get_or_init(|| std::env::var_os("QG_TRACE").is_some()) {
        eprintln!("  {line}");
    }
    t.lock().unwrap_or_else(|e| e.into_inner()).push(line);
}

/// Reads the case's bytes; past the end every read is 0, so any prefix is a case too.
struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> u8 {
        let v = self.b.get(self.i).copied().unwrap_or(0);
        self.i = self.i.saturating_add(1);
        v
    }
    fn done(&self) -> bool {
        self.i >= self.b.len()
    }
    fn below(&mut self, n: usize) -> usize {
        if n <= 1 { 0 } else { self.byte() as usize % n }
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    /// True with probability `k` / 256.
    fn chance(&mut self, k: u8) -> bool {
        self.byte() < k
    }
    /// A dimension: mostly small, sometimes 0, rarely far too big to allocate.
    fn dim(&mut self) -> usize {
        const DIMS: [usize; 32] = [
            1, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 4, 5, 5, 6, 7, 8, 8, 8, 9, 11, 12, 13, 16, 16, 17, 24,
            31, 32, 33, 64, 0,
        ];
        const HUGE: [usize; 6] = [1 << 20, 1 << 31, 1 << 40, 1 << 62, usize::MAX / 2, usize::MAX];
        let b = self.byte();
        if b >= 252 { self.pick(&HUGE) } else { DIMS[b as usize % DIMS.len()] }
    }
    /// ne[0] for `dtype`: whole blocks, now and then not.
    fn dim0(&mut self, dtype: DType) -> usize {
        let bs = dtype.block_size();
        if bs == 1 {
            return self.dim();
        }
        match self.byte() {
            0..=3 => bs + 1,
            4..=7 => 0,
            8 => self.dim(),
            b => bs * [1, 1, 1, 2, 2, 3, 4, 5][b as usize % 8],
        }
    }
    /// A float parameter: common values, edge values and non-finite ones.
    fn param(&mut self) -> f32 {
        const P: [f32; 24] = [
            1.0,
            1.0,
            0.5,
            0.0,
            -1.0,
            2.0,
            0.125,
            1e-5,
            1e-6,
            10000.0,
            -0.5,
            8.0,
            0.1,
            3.0,
            30.0,
            -0.0,
            1e30,
            -1e30,
            1e-40,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN_POSITIVE,
        ];
        self.pick(&P)
    }
    /// A small count or offset, sometimes huge.
    fn small(&mut self) -> usize {
        match self.byte() {
            250 => usize::MAX,
            251 => 1 << 40,
            252 => i32::MAX as usize,
            b => b as usize % 20,
        }
    }
}

const LEAF_TYPES: [DType; 24] = [
    DType::F32,
    DType::F32,
    DType::F32,
    DType::F32,
    DType::F32,
    DType::F32,
    DType::F32,
    DType::F32,
    DType::F32,
    DType::F16,
    DType::F16,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::I32,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_K,
    DType::Q6_K,
    DType::IQ4_NL,
    DType::Q5_1,
    DType::Q2_K,
    DType::MXFP4,
    DType::TQ2_0,
];

const REPACKABLE: [DType; 7] =
    [DType::Q4_0, DType::IQ4_NL, DType::MXFP4, DType::Q4_K, DType::Q6_K, DType::Q2_K, DType::TQ2_0];

/// The common unary ops drawn twice as often as the rest.
const UNARY_COMMON: [UnaryOp; 3] = [UnaryOp::Silu, UnaryOp::Gelu, UnaryOp::Relu];

const ROPE_MODES: [RopeMode; 6] = [
    RopeMode::Normal,
    RopeMode::Neox,
    RopeMode::Normal,
    RopeMode::Mrope,
    RopeMode::Vision,
    RopeMode::Imrope,
];

/// How an input's data is made.
#[derive(Clone, Copy)]
enum Fill {
    /// Values for the type: floats in [-2, 2), small integers; quantized types quantized from
    /// such floats.
    Values,
    /// Floats with zeros, huge and tiny values, infinities and NaNs.
    Wild,
    /// Raw random bytes (any bit pattern, including NaN scales of quantized blocks).
    Raw,
    /// Indices, mostly in `0..limit`, now and then outside.
    Ids { limit: usize },
}

/// One build of a case: the graph and what the runs need to feed and read it.
struct Built {
    g: Graph,
    inputs: Vec<(TensorId, Vec<u8>)>,
    /// Caller buffers the graph may write (states), compared after compute.
    states: Vec<Buffer>,
    outputs: Vec<TensorId>,
    /// Every tensor made, in order.
    pool: Vec<TensorId>,
    calls: usize,
    calls_ok: usize,
}

struct Builder<'a> {
    r: Reader<'a>,
    b: Built,
    rng: u64,
    trace: Option<&'a Trace>,
}

/// A product of dims that saturates: shapes from the pool may be huge, and a saturated size is
/// as good a hostile argument as any.
fn prod(ne: &[usize]) -> usize {
    ne.iter().fold(1usize, |n, &d| n.saturating_mul(d))
}

fn ne_str(ne: &[usize]) -> String {
    let parts: Vec<String> = ne.iter().map(|&d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

impl<'a> Builder<'a> {
    fn new(bytes: &'a [u8], trace: Option<&'a Trace>) -> Builder<'a> {
        let mut r = Reader { b: bytes, i: 0 };
        let seed = u64::from(r.byte()) | (u64::from(r.byte()) << 8);
        Builder {
            r,
            b: Built {
                g: Graph::new(),
                inputs: Vec::new(),
                states: Vec::new(),
                outputs: Vec::new(),
                pool: Vec::new(),
                calls: 0,
                calls_ok: 0,
            },
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            trace,
        }
    }

    fn log(&self, line: String) {
        if let Some(t) = self.trace {
            push(t, line);
        }
    }

    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
    }

    /// Records a builder call; its result joins the pool.
    fn rec(&mut self, call: String, r: quantgraph::Result<TensorId>) -> Option<TensorId> {
        self.b.calls += 1;
        match r {
            Ok(id) => {
                self.b.calls_ok += 1;
                let g = &self.b.g;
                let (dt, ne, nb) =
                    (g.dtype(id).unwrap(), g.shape(id).unwrap(), g.strides(id).unwrap());
                self.log(format!(
                    "#{} = {call} -> {dt} {} nb {}",
                    id.index(),
                    ne_str(&ne),
                    ne_str(&nb)
                ));
                self.b.pool.push(id);
                Some(id)
            }
            Err(e) => {
                self.log(format!("{call} -> Err({e})"));
                None
            }
        }
    }

    /// A tensor of the pool: mostly one of the last few made.
    fn src(&mut self) -> Option<TensorId> {
        let n = self.b.pool.len();
        if n == 0 {
            return None;
        }
        let b = self.r.byte() as usize;
        let back = if b < 192 { b % n.min(6) } else { b % n };
        Some(self.b.pool[n - 1 - back])
    }

    fn shape(&self, id: TensorId) -> [usize; 4] {
        self.b.g.shape(id).unwrap()
    }
    fn dtype(&self, id: TensorId) -> DType {
        self.b.g.dtype(id).unwrap()
    }

    fn leaf_type(&mut self) -> DType {
        if self.r.chance(16) { self.r.pick(&DType::ALL) } else { self.r.pick(&LEAF_TYPES) }
    }

    /// A leaf shape: 1 to 4 dims.
    fn leaf_shape(&mut self, dtype: DType) -> Vec<usize> {
        let nd = 1 + self.r.below(4);
        let mut ne = vec![self.r.dim0(dtype)];
        for _ in 1..nd {
            ne.push(self.r.dim());
        }
        ne
    }

    fn fill_style(&mut self) -> Fill {
        match self.r.byte() {
            0..=15 => Fill::Wild,
            16..=23 => Fill::Raw,
            _ => Fill::Values,
        }
    }

    /// Bytes of a contiguous `dtype` tensor of shape `ne`, or `None` when it is too big.
    fn data(&mut self, dtype: DType, ne: &[usize], fill: Fill) -> Option<Vec<u8>> {
        let mut ne4 = [1usize; 4];
        ne4[..ne.len()].copy_from_slice(ne);
        let rows = ne4[1].checked_mul(ne4[2])?.checked_mul(ne4[3])?;
        let bytes = dtype.row_size(ne4[0]).ok()?.checked_mul(rows)?;
        let n = ne4[0].checked_mul(rows)?;
        // A tensor too big to compute gets no data: quantizing it would only take time.
        if bytes > MAX_INPUT_BYTES || n > MAX_COMPUTE_ELEMS {
            return None;
        }
        let raw = |s: &mut Self| (0..bytes).map(|_| s.next() as u8).collect::<Vec<u8>>();
        let floats = |s: &mut Self, wild: bool| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    if wild && s.next().is_multiple_of(4) {
                        [0.0, -0.0, 1e30, -1e30, 1e-40, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]
                            [(s.next() % 8) as usize]
                    } else {
                        s.unit()
                    }
                })
                .collect()
        };
        Some(match (fill, dtype) {
            (Fill::Raw, _) => raw(self),
            (Fill::Ids { limit }, DType::I32 | DType::I64) => {
                let hostile = self.next().is_multiple_of(8);
                let vals: Vec<i64> = (0..n)
                    .map(|_| {
                        if hostile && self.next().is_multiple_of(3) {
                            [-1, limit as i64, i32::MAX as i64, i32::MIN as i64, i64::MAX]
                                [(self.next() % 5) as usize]
                        } else {
                            (self.next() % limit.max(1) as u64) as i64
                        }
                    })
                    .collect();
                if dtype == DType::I32 {
                    vals.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect()
                } else {
                    vals.iter().flat_map(|&v| v.to_le_bytes()).collect()
                }
            }
            (_, DType::I32) => {
                (0..n).flat_map(|_| ((self.next() % 10) as i32 - 1).to_le_bytes()).collect()
            }
            (_, DType::F32) => {
                let wild = matches!(fill, Fill::Wild);
                floats(self, wild).iter().flat_map(|v| v.to_le_bytes()).collect()
            }
            (_, DType::I8 | DType::I16 | DType::I64 | DType::F64) => raw(self),
            (f, _) => {
                let v = floats(self, matches!(f, Fill::Wild));
                let mut q = vec![0u8; bytes];
                if quantgraph::quant::quantize(dtype, &v, &mut q).is_err() {
                    q = raw(self);
                }
                q
            }
        })
    }

    /// A new input with data.
    fn input(&mut self, dtype: DType, ne: &[usize], fill: Fill) -> Option<TensorId> {
        let r = self.b.g.input(dtype, ne);
        let id = self.rec(format!("input({dtype}, {})", ne_str(ne)), r)?;
        if let Some(d) = self.data(dtype, ne, fill) {
            self.b.inputs.push((id, d));
        }
        Some(id)
    }

    /// A new F32 input shaped like `a`, or broadcastable to it.
    fn input_like(&mut self, a: TensorId, dtype: DType) -> Option<TensorId> {
        let mut ne = self.shape(a);
        match self.r.byte() % 8 {
            0..=2 => {}
            3..=5 => {
                for d in ne.iter_mut() {
                    if self.r.chance(100) {
                        *d = 1;
                    }
                }
            }
            6 => ne = [ne[0], 1, 1, 1],
            _ => ne.swap(0, 1),
        }
        let fill = self.fill_style();
        self.input(dtype, &ne, fill)
    }

    /// A weight or state in a caller buffer, at an offset that may be misaligned or out of range.
    fn bound(&mut self, state: bool) -> Option<TensorId> {
        let dtype = self.leaf_type();
        let ne = self.leaf_shape(dtype);
        let fill = self.fill_style();
        let data = self.data(dtype, &ne, fill)?;
        let offset = match self.r.byte() % 8 {
            0..=3 => 0,
            4 | 5 => dtype.align() * self.r.below(5),
            6 => self.r.below(9),
            _ => data.len() + self.r.below(3) * 4,
        };
        let extra = self.r.below(3) * 16;
        let buf = Buffer::alloc(offset + data.len() + extra).ok()?;
        let _ = buf.write(offset, &data);
        let (what, r) = if state {
            ("state", self.b.g.state(dtype, &ne, &buf, offset))
        } else {
            ("weight", self.b.g.weight(dtype, &ne, &buf, offset))
        };
        let id = self.rec(
            format!("{what}({dtype}, {}, buffer of {}, {offset})", ne_str(&ne), buf.len()),
            r,
        )?;
        if state {
            self.b.states.push(buf);
        }
        Some(id)
    }

    /// A weight in a CPU_REPACK buffer.
    fn repacked(&mut self, dtype: DType, ne: &[usize]) -> Option<TensorId> {
        let data = self.data(dtype, ne, Fill::Values)?;
        let buf = CpuRepackBufferType.alloc(data.len()).ok()?;
        if let Err(e) = buf.set_tensor(0, dtype, ne, &data) {
            self.log(format!("repack set_tensor({dtype}, {}) -> Err({e})", ne_str(ne)));
            return None;
        }
        let r = self.b.g.weight(dtype, ne, &buf, 0);
        self.rec(format!("weight({dtype}, {}, repacked buffer, 0)", ne_str(ne)), r)
    }

    /// Strides for a view of shape `ne` into `a`: contiguous, `a`'s, padded, or arbitrary.
    fn view_strides(&mut self, dtype: DType, a: TensorId, ne: &[usize; 4]) -> [usize; 3] {
        let ts = dtype.type_size();
        let row = (ne[0] / dtype.block_size()).saturating_mul(ts);
        let mut nb =
            [row, row.saturating_mul(ne[1]), row.saturating_mul(ne[1]).saturating_mul(ne[2])];
        match self.r.byte() % 8 {
            0..=2 => {}
            3 => {
                let s = self.b.g.strides(a).unwrap();
                nb = [s[1], s[2], s[3]];
            }
            4 | 5 => {
                let pad = dtype.align() * self.r.below(4);
                nb[0] = nb[0].saturating_add(pad);
                nb[1] = nb[0].saturating_mul(ne[1]).saturating_add(pad);
                nb[2] = nb[1].saturating_mul(ne[2]);
            }
            6 => {
                for s in nb.iter_mut() {
                    *s = self.r.below(40) * ts / 2;
                }
            }
            _ => {
                // Dims in another order: a permuted, overlapping or aliasing walk.
                nb.swap(0, 1 + self.r.below(2));
            }
        }
        nb
    }

    fn view(&mut self) -> Option<()> {
        let a = self.src()?;
        let dtype = self.dtype(a);
        let nd = 1 + self.r.below(4);
        let an = self.shape(a);
        let mut ne = [1usize; 4];
        for d in 0..nd {
            ne[d] = if self.r.chance(128) {
                an[d]
            } else if d == 0 {
                self.r.dim0(dtype)
            } else {
                self.r.dim()
            };
        }
        let nb = self.view_strides(dtype, a, &ne);
        let offset = match self.r.byte() % 8 {
            0..=3 => 0,
            4 | 5 => dtype.type_size() * self.r.below(9),
            6 => self.r.below(13),
            _ => self.r.small().saturating_mul(4),
        };
        let g = &mut self.b.g;
        let (call, r) = match nd {
            1 => (
                format!("view_1d(#{}, {}, {offset})", a.index(), ne[0]),
                g.view_1d(a, ne[0], offset),
            ),
            2 => (
                format!("view_2d(#{}, {}, {}, {offset})", a.index(), ne_str(&ne[..2]), nb[0]),
                g.view_2d(a, [ne[0], ne[1]], nb[0], offset),
            ),
            3 => (
                format!(
                    "view_3d(#{}, {}, {}, {offset})",
                    a.index(),
                    ne_str(&ne[..3]),
                    ne_str(&nb[..2])
                ),
                g.view_3d(a, [ne[0], ne[1], ne[2]], [nb[0], nb[1]], offset),
            ),
            _ => (
                format!("view_4d(#{}, {}, {}, {offset})", a.index(), ne_str(&ne), ne_str(&nb)),
                g.view_4d(a, ne, nb, offset),
            ),
        };
        self.rec(call, r).map(|_| ())
    }

    /// A new matrix product with fresh operands: a weight type, K in whole blocks of the weight
    /// and its vec-dot type (or not), row counts around the kernels' tile sizes, broadcast batches.
    fn mul_mat_fresh(&mut self) -> Option<()> {
        let wt =
            if self.r.chance(64) { self.r.pick(&REPACKABLE) } else { self.r.pick(&DType::ALL) };
        let bs = wt.block_size().max(wt.vec_dot_type().block_size());
        let k = if self.r.chance(8) { self.r.dim() } else { bs * self.r.pick(&[1, 1, 2, 3]) };
        let m = self.r.pick(&[1, 2, 3, 4, 7, 8, 9, 16, 17, 32]);
        let n = self.r.pick(&[1, 1, 2, 3, 5, 6, 7, 8, 12, 16, 17]);
        let (p, q) = (self.r.pick(&[1, 1, 2]), self.r.pick(&[1, 1, 2]));
        let (rr, ss) = (self.r.pick(&[1, 1, 2, 3]), self.r.pick(&[1, 1, 2]));
        let a = match self.r.byte() % 8 {
            0 if p * q == 1 => self.repacked(wt, &[k, m])?,
            1 => {
                // Rows padded inside a bigger tensor: contiguous rows, a row stride of more.
                let pad = wt.block_size() * self.r.pick(&[1, 2]);
                let big = self.input(wt, &[k.saturating_add(pad), m, p, q], Fill::Values)?;
                let row = wt.row_size(k.saturating_add(pad)).ok()?;
                let r = self.b.g.view_4d(
                    big,
                    [k, m, p, q],
                    [row, prod(&[row, m]), prod(&[row, m, p])],
                    0,
                );
                self.rec(
                    format!("view_4d(#{}, {}, [{row}, ..], 0)", big.index(), ne_str(&[k, m, p, q])),
                    r,
                )?
            }
            _ => {
                let fill = self.fill_style();
                self.input(wt, &[k, m, p, q], fill)?
            }
        };
        let bt = if self.r.chance(24) { wt.vec_dot_type() } else { DType::F32 };
        let b = if bt == DType::F32 && self.r.chance(48) {
            // A transposed b: [n, k] stored, read as [k, n].
            let t = self.input(bt, &[n, k, p * rr, q * ss], Fill::Values)?;
            let r = self.b.g.transpose(t);
            self.rec(format!("transpose(#{})", t.index()), r)?
        } else {
            let fill = self.fill_style();
            self.input(bt, &[k, n, p * rr, q * ss], fill)?
        };
        let r = self.b.g.mul_mat(a, b);
        self.rec(format!("mul_mat(#{}, #{})", a.index(), b.index()), r).map(|_| ())
    }

    fn mul_mat_id_fresh(&mut self) -> Option<()> {
        let wt =
            if self.r.chance(48) { self.r.pick(&REPACKABLE) } else { self.r.pick(&DType::ALL) };
        let bs = wt.block_size().max(wt.vec_dot_type().block_size());
        let k = bs * self.r.pick(&[1, 1, 2]);
        let m = self.r.pick(&[1, 2, 4, 8, 9, 16]);
        let n_expert = self.r.pick(&[1, 2, 3, 4]);
        let n_used = self.r.pick(&[1, 2, 3]);
        let n_tok = self.r.pick(&[1, 2, 3, 6, 7, 8]);
        let n_b = if self.r.chance(128) { 1 } else { n_used };
        let a = if self.r.chance(48) {
            self.repacked(wt, &[k, m, n_expert])?
        } else {
            let fill = self.fill_style();
            self.input(wt, &[k, m, n_expert], fill)?
        };
        let bt = if self.r.chance(24) { wt.vec_dot_type() } else { DType::F32 };
        let b = self.input(bt, &[k, n_b, n_tok], Fill::Values)?;
        let ids = self.input(DType::I32, &[n_used, n_tok], Fill::Ids { limit: n_expert })?;
        let r = self.b.g.mul_mat_id(a, b, ids);
        self.rec(format!("mul_mat_id(#{}, #{}, #{})", a.index(), b.index(), ids.index()), r)
            .map(|_| ())
    }

    /// A K or V type, F16 (the usual cache type) twice as likely as each other.
    fn kv_type(&mut self) -> DType {
        KV_TYPES[self.r.below(KV_TYPES.len() + 1).saturating_sub(1)]
    }

    /// A unary op: every one, the common ones twice as likely.
    fn unary_op(&mut self) -> UnaryOp {
        let i = self.r.below(UNARY_PLAIN.len() + UNARY_COMMON.len() + 1);
        if let Some(&op) = UNARY_PLAIN.get(i) {
            op
        } else if let Some(&op) = UNARY_COMMON.get(i - UNARY_PLAIN.len()) {
            op
        } else {
            let (alpha_n, alpha_p, beta, eps) = XIELU;
            UnaryOp::Xielu { alpha_n, alpha_p, beta, eps }
        }
    }

    fn flash_attn_fresh(&mut self) -> Option<()> {
        let (kt, vt) = if self.r.chance(128) {
            let t = self.kv_type();
            (t, t)
        } else {
            (self.kv_type(), self.kv_type())
        };
        let d = self.r.pick(&[32, 64, 32, 16, 8, 40]);
        let dv = if self.r.chance(32) { self.r.pick(&[32, 64]) } else { d };
        let n_q = self.r.pick(&[1, 1, 2, 3, 4, 7]);
        let n_kv = self.r.pick(&[1, 2, 5, 16, 33, 64]);
        let h_kv = self.r.pick(&[1, 1, 2]);
        let h = h_kv * self.r.pick(&[1, 2, 4]);
        let q = self.input(DType::F32, &[d, n_q, h], Fill::Values)?;
        let k = self.input(kt, &[d, n_kv, h_kv], Fill::Values)?;
        let v = self.input(vt, &[dv, n_kv, h_kv], Fill::Values)?;
        let mask = if self.r.chance(160) {
            let mt = self.r.pick(&[DType::F16, DType::F16, DType::F32]);
            let pad = self.r.pick(&[0, 0, 1, 3]);
            let fill = if self.r.chance(64) { Fill::Wild } else { Fill::Values };
            let cols = n_kv + self.r.below(2);
            Some(self.input(mt, &[cols, n_q + pad], fill)?)
        } else {
            None
        };
        let sinks = if self.r.chance(40) {
            Some(self.input(DType::F32, &[h], Fill::Values)?)
        } else {
            None
        };
        let mut p = FlashAttnParams::new(self.r.param());
        if self.r.chance(40) {
            p.max_bias = self.r.param();
        }
        if self.r.chance(40) {
            p.logit_softcap = self.r.param();
        }
        let r = self.b.g.flash_attn_ext(q, k, v, mask, sinks, p);
        let call = format!(
            "flash_attn_ext(#{}, #{}, #{}, {:?}, {:?}, {p:?})",
            q.index(),
            k.index(),
            v.index(),
            mask.map(|m| m.index()),
            sinks.map(|s| s.index())
        );
        self.rec(call, r).map(|_| ())
    }

    fn rope(&mut self) -> Option<()> {
        let a = if self.r.chance(128) {
            self.src()?
        } else {
            let hd = self.r.pick(&[2, 4, 6, 8, 16, 64, 3]);
            let dt = if self.r.chance(200) { DType::F32 } else { DType::F16 };
            let ne = [hd, self.r.pick(&[1, 2, 4]), self.r.pick(&[1, 2, 3, 5])];
            self.input(dt, &ne, Fill::Values)?
        };
        let ne = self.shape(a);
        let mode = self.r.pick(&ROPE_MODES);
        let n_dims = match self.r.byte() % 8 {
            0..=3 => ne[0],
            4 | 5 => ne[0] / 2,
            6 => ne[0].saturating_sub(1),
            _ => self.r.pick(&[0, 2, ne[0].saturating_add(2)]),
        };
        let mut p = RopeParams::new(
            n_dims,
            mode,
            if self.r.chance(200) { 10000.0 } else { self.r.param() },
        );
        if self.r.chance(64) {
            p.freq_scale = self.r.param();
            p.ext_factor = self.r.param();
            p.attn_factor = self.r.param();
            p.beta_fast = self.r.param();
            p.beta_slow = self.r.param();
            p.n_ctx_orig = self.r.pick(&[0, 4096, -1, i32::MAX]);
        }
        let n_pos =
            if mode.is_multi() && !self.r.chance(16) { ne[2].saturating_mul(4) } else { ne[2] };
        let pos = self.input(DType::I32, &[n_pos], Fill::Ids { limit: 64 })?;
        let ff = if self.r.chance(48) {
            let n = (n_dims / 2).max(1) + self.r.below(2);
            Some(self.input(DType::F32, &[n], Fill::Values)?)
        } else {
            None
        };
        let call = |name: &str, s: Option<[i32; 4]>| {
            format!(
                "{name}(#{}, #{}, {:?}, {s:?}, {p:?})",
                a.index(),
                pos.index(),
                ff.map(|f| f.index())
            )
        };
        if mode.is_multi() {
            let q = (ne[0] / 4) as i32;
            let sections = match self.r.byte() % 4 {
                0 => [q, q, q, q],
                1 => [q, q, 0, 0],
                2 => [(ne[0] / 2) as i32, 0, 0, 0],
                _ => [self.r.below(8) as i32 - 1, self.r.below(8) as i32, 0, 1],
            };
            let r = self.b.g.rope_multi(a, pos, ff, sections, p);
            self.rec(call("rope_multi", Some(sections)), r).map(|_| ())
        } else {
            let r = self.b.g.rope_ext(a, pos, ff, p);
            self.rec(call("rope_ext", None), r).map(|_| ())
        }
    }

    /// One builder call (or a small group of them) read from the bytes.
    fn step(&mut self) -> Option<()> {
        let op = self.r.byte() % 30;
        match op {
            0 | 1 => {
                let dt = self.leaf_type();
                let ne = self.leaf_shape(dt);
                let fill = self.fill_style();
                self.input(dt, &ne, fill).map(|_| ())
            }
            2 => {
                let a = self.src()?;
                let dt = if self.r.chance(200) { DType::F32 } else { self.leaf_type() };
                self.input_like(a, dt).map(|_| ())
            }
            3 => {
                let state = self.r.chance(128);
                self.bound(state).map(|_| ())
            }
            4 => {
                let a = self.src()?;
                let op = self.unary_op();
                let inplace = self.r.chance(64);
                let r = if inplace { self.b.g.unary_inplace(a, op) } else { self.b.g.unary(a, op) };
                self.rec(format!("unary(#{}, {op:?}, inplace {inplace})", a.index()), r).map(|_| ())
            }
            5 | 6 => {
                let a = self.src()?;
                let b = if self.r.chance(96) {
                    self.src()?
                } else {
                    let dt = if self.r.chance(220) { DType::F32 } else { self.dtype(a) };
                    self.input_like(a, dt)?
                };
                let k = self.r.byte() % 12;
                let g = &mut self.b.g;
                let (name, r) = match k {
                    0 | 1 => ("add", g.add(a, b)),
                    2 => ("sub", g.sub(a, b)),
                    3 | 4 => ("mul", g.mul(a, b)),
                    5 => ("div", g.div(a, b)),
                    6 => ("add_inplace", g.add_inplace(a, b)),
                    7 => ("mul_inplace", g.mul_inplace(a, b)),
                    8 => ("add1", g.add1(a, b)),
                    9 => ("add_cast f16", g.add_cast(a, b, DType::F16)),
                    10 => ("count_equal", g.count_equal(a, b)),
                    _ => ("out_prod", g.out_prod(a, b)),
                };
                self.rec(format!("{name}(#{}, #{})", a.index(), b.index()), r).map(|_| ())
            }
            7 => {
                let a = self.src()?;
                let (x, y) = (self.r.param(), self.r.param());
                let k = self.r.byte() % 14;
                let g = &mut self.b.g;
                let (name, r) = match k {
                    0 => ("scale", g.scale(a, x)),
                    1 => ("scale_bias", g.scale_bias(a, x, y)),
                    2 => ("clamp", g.clamp(a, x, y)),
                    3 => ("leaky_relu", g.leaky_relu(a, x)),
                    4 => ("leaky_relu inplace", g.leaky_relu_inplace(a, x)),
                    5 => ("sqr", g.sqr(a)),
                    6 => ("sqrt", g.sqrt(a)),
                    7 => ("log", g.log(a)),
                    8 => ("sin", g.sin(a)),
                    9 => ("cos_inplace", g.cos_inplace(a)),
                    10 => ("fill", g.fill(a, x)),
                    11 => ("fill_inplace", g.fill_inplace(a, x)),
                    12 => ("sqr_inplace", g.sqr_inplace(a)),
                    _ => ("xielu", g.xielu(a, x, y, 0.5, -1e-6)),
                };
                self.rec(format!("{name}(#{}, {x}, {y})", a.index()), r).map(|_| ())
            }
            8 => {
                let (a, b) = (self.src()?, self.src()?);
                let r = self.b.g.mul_mat(a, b);
                self.rec(format!("mul_mat(#{}, #{})", a.index(), b.index()), r).map(|_| ())
            }
            9..=11 => self.mul_mat_fresh(),
            12 => {
                let a = self.src()?;
                let ne = self.shape(a);
                let mask = if self.r.chance(128) {
                    let mt = self.r.pick(&[DType::F16, DType::F32]);
                    let rows = ne[1].saturating_add(self.r.pick(&[0, 0, 1, 3]));
                    let (m2, m3) = (self.r.pick(&[1, 1, ne[2]]), self.r.pick(&[1, ne[3]]));
                    let fill = if self.r.chance(96) { Fill::Wild } else { Fill::Values };
                    Some(self.input(mt, &[ne[0], rows, m2, m3], fill)?)
                } else {
                    None
                };
                let scale = if self.r.chance(160) { 1.0 } else { self.r.param() };
                let max_bias = if self.r.chance(200) { 0.0 } else { self.r.param() };
                let call = format!(
                    "soft_max_ext(#{}, {:?}, {scale}, {max_bias})",
                    a.index(),
                    mask.map(|m| m.index())
                );
                if self.r.chance(40) {
                    let s = self.input(DType::F32, &[ne[2]], Fill::Values)?;
                    let r = self.b.g.soft_max_ext_sinks(a, mask, s, scale, max_bias);
                    self.rec(format!("{call} sinks #{}", s.index()), r).map(|_| ())
                } else {
                    let r = self.b.g.soft_max_ext(a, mask, scale, max_bias);
                    self.rec(call, r).map(|_| ())
                }
            }
            13 => {
                let a = self.src()?;
                let eps = if self.r.chance(200) { 1e-5 } else { self.r.param() };
                let k = self.r.byte() % 6;
                let (name, r) = match k {
                    0 | 1 => ("rms_norm", self.b.g.rms_norm(a, eps)),
                    2 => ("norm", self.b.g.norm(a, eps)),
                    3 => ("l2_norm", self.b.g.l2_norm(a, eps)),
                    4 => {
                        let groups = self.r.pick(&[1, 2, 3, 0]);
                        ("group_norm", self.b.g.group_norm(a, groups, eps))
                    }
                    _ => {
                        let w = self.input_like(a, DType::F32)?;
                        let r = self.b.g.rms_norm_mul(a, w, eps);
                        return self
                            .rec(format!("rms_norm_mul(#{}, #{}, {eps})", a.index(), w.index()), r)
                            .map(|_| ());
                    }
                };
                self.rec(format!("{name}(#{}, {eps})", a.index()), r).map(|_| ())
            }
            14 => self.rope(),
            15 => {
                let a = self.src()?;
                let ne = self.shape(a);
                let k = self.r.pick(&[1, 2, 3, 5, 0]);
                let ids = if self.r.chance(32) {
                    self.src()?
                } else {
                    self.input(DType::I32, &[k, ne[2], ne[3]], Fill::Ids { limit: ne[1] })?
                };
                let r = self.b.g.get_rows(a, ids);
                self.rec(format!("get_rows(#{}, #{})", a.index(), ids.index()), r).map(|_| ())
            }
            16 => {
                let dst = if self.r.chance(128) { self.src()? } else { self.bound(true)? };
                let ne = self.shape(dst);
                let k = self.r.pick(&[1, 2, 3]);
                let bt = if self.r.chance(200) { DType::F32 } else { DType::F16 };
                let b = self.input(bt, &[ne[0], k, ne[2], ne[3]], Fill::Values)?;
                let it = if self.r.chance(200) { DType::I32 } else { DType::I64 };
                let ids = self.input(it, &[k, ne[2], ne[3]], Fill::Ids { limit: ne[1] })?;
                let r = self.b.g.set_rows(dst, b, ids);
                self.rec(format!("set_rows(#{}, #{}, #{})", dst.index(), b.index(), ids.index()), r)
                    .map(|_| ())
            }
            17 | 18 => {
                let a = self.src()?;
                let ne = self.shape(a);
                let dst = match self.r.byte() % 6 {
                    0 => self.src()?,
                    1 => {
                        let dt = self.leaf_type();
                        self.input(dt, &[prod(&ne)], Fill::Values)?
                    }
                    2 => {
                        // A transposed destination.
                        let t =
                            self.input(DType::F32, &[ne[1], ne[0], ne[2], ne[3]], Fill::Values)?;
                        let r = self.b.g.transpose(t);
                        self.rec(format!("transpose(#{})", t.index()), r)?
                    }
                    3 => {
                        let s = self.bound(true)?;
                        let sn = self.shape(s);
                        let row = self.dtype(s).row_size(sn[0]).ok()?;
                        let r = self.b.g.view_4d(
                            s,
                            ne,
                            [row, prod(&[row, ne[1]]), prod(&[row, ne[1], ne[2]])],
                            0,
                        );
                        self.rec(format!("view_4d(#{}, {}, row {row})", s.index(), ne_str(&ne)), r)?
                    }
                    _ => {
                        let dt = self.r.pick(&[
                            DType::F32,
                            DType::F16,
                            DType::BF16,
                            DType::Q8_0,
                            DType::Q4_0,
                            DType::I32,
                            DType::Q4_K,
                        ]);
                        self.input(dt, &ne, Fill::Values)?
                    }
                };
                let r = self.b.g.cpy(a, dst);
                self.rec(format!("cpy(#{}, #{})", a.index(), dst.index()), r).map(|_| ())
            }
            19 | 20 => self.view(),
            21 => {
                let a = self.src()?;
                let (name, r) = if self.r.chance(96) {
                    ("transpose", self.b.g.transpose(a))
                } else {
                    let mut axes = [0, 1, 2, 3];
                    for i in (1..4).rev() {
                        let j = self.r.below(i + 1);
                        axes.swap(i, j);
                    }
                    if self.r.chance(8) {
                        axes[3] = axes[0];
                    }
                    ("permute", self.b.g.permute(a, axes))
                };
                self.rec(format!("{name}(#{})", a.index()), r).map(|_| ())
            }
            22 => {
                let a = self.src()?;
                let ne = self.shape(a);
                let n = prod(&ne);
                let new: Vec<usize> = match self.r.byte() % 6 {
                    0 => vec![n],
                    1 => vec![prod(&ne[..2]), prod(&ne[2..])],
                    2 => vec![ne[0], prod(&ne[1..])],
                    3 => vec![ne[0], ne[2], ne[1], ne[3]],
                    4 => vec![ne[1], ne[0], ne[2], ne[3]],
                    _ => vec![self.r.dim(), self.r.dim()],
                };
                let (name, r) = if self.r.chance(64) {
                    ("cont_reshape", self.b.g.cont_reshape(a, &new))
                } else {
                    ("reshape", self.b.g.reshape(a, &new))
                };
                self.rec(format!("{name}(#{}, {})", a.index(), ne_str(&new)), r).map(|_| ())
            }
            23 => {
                let a = self.src()?;
                if self.r.chance(128) {
                    let r = self.b.g.cont(a);
                    self.rec(format!("cont(#{})", a.index()), r).map(|_| ())
                } else {
                    let dt = self.leaf_type();
                    let r = self.b.g.cast(a, dt);
                    self.rec(format!("cast(#{}, {dt})", a.index()), r).map(|_| ())
                }
            }
            24 => {
                let a = self.src()?;
                let dim = self.r.below(5);
                let b = if self.r.chance(64) {
                    self.src()?
                } else {
                    let mut ne = self.shape(a);
                    if dim < 4 {
                        ne[dim] = self.r.dim();
                    }
                    let dt = self.dtype(a);
                    self.input(dt, &ne, Fill::Values)?
                };
                let r = self.b.g.concat(a, b, dim);
                self.rec(format!("concat(#{}, #{}, {dim})", a.index(), b.index()), r).map(|_| ())
            }
            25 => {
                let a = self.src()?;
                let ne = self.shape(a);
                let k = self.r.byte() % 5;
                let (call, r) = match k {
                    0 => {
                        let m = [
                            self.r.pick(&[1, 2]),
                            self.r.pick(&[1, 2, 3]),
                            self.r.pick(&[1, 2]),
                            1,
                        ];
                        let t = [
                            prod(&[ne[0], m[0]]),
                            prod(&[ne[1], m[1]]),
                            prod(&[ne[2], m[2]]),
                            ne[3],
                        ];
                        (format!("repeat(#{}, {})", a.index(), ne_str(&t)), self.b.g.repeat(a, t))
                    }
                    1 => {
                        let rp = [self.r.below(3), self.r.below(3), self.r.below(2), 0];
                        (format!("pad(#{}, {})", a.index(), ne_str(&rp)), self.b.g.pad(a, rp))
                    }
                    2 => {
                        let lp = [self.r.below(3), self.r.below(2), 0, 0];
                        let rp = [self.r.below(3), self.r.below(2), self.r.below(2), 0];
                        let circ = self.r.chance(128);
                        (
                            format!(
                                "pad_ext(#{}, {}, {}, {circ})",
                                a.index(),
                                ne_str(&lp),
                                ne_str(&rp)
                            ),
                            self.b.g.pad_ext(a, lp, rp, circ),
                        )
                    }
                    3 => {
                        let s = [
                            self.r.below(5) as i64 - 2,
                            self.r.below(3) as i64 - 1,
                            0,
                            self.r.below(2) as i64,
                        ];
                        (format!("roll(#{}, {s:?})", a.index()), self.b.g.roll(a, s))
                    }
                    _ => {
                        let (p0, p1) = (self.r.below(4), self.r.below(4));
                        (
                            format!("pad_reflect_1d(#{}, {p0}, {p1})", a.index()),
                            self.b.g.pad_reflect_1d(a, p0, p1),
                        )
                    }
                };
                self.rec(call, r).map(|_| ())
            }
            26 => {
                let a = self.src()?;
                let k = self.r.byte() % 9;
                let g = &mut self.b.g;
                let (name, r) = match k {
                    0 => ("sum", g.sum(a)),
                    1 => ("sum_rows", g.sum_rows(a)),
                    2 => ("mean", g.mean(a)),
                    3 => ("argmax", g.argmax(a)),
                    4 => ("cumsum", g.cumsum(a)),
                    5 => ("argsort asc", g.argsort(a, SortOrder::Asc)),
                    6 => ("argsort desc", g.argsort(a, SortOrder::Desc)),
                    7 => ("diag", g.diag(a)),
                    _ => {
                        let kk = self.r.pick(&[1, 2, 3, 0, 100]);
                        ("top_k", self.b.g.top_k(a, kk))
                    }
                };
                self.rec(format!("{name}(#{})", a.index()), r).map(|_| ())
            }
            27 => {
                let a = self.src()?;
                let op = self.r.pick(&GLU_OPS);
                let k = self.r.byte() % 4;
                let (call, r) = match k {
                    0 | 1 => {
                        let sw = self.r.chance(128);
                        (format!("glu(#{}, {op:?}, {sw})", a.index()), self.b.g.glu(a, op, sw))
                    }
                    2 => {
                        let b = self.input_like(a, DType::F32)?;
                        (
                            format!("glu_split(#{}, #{}, {op:?})", a.index(), b.index()),
                            self.b.g.glu_split(a, b, op),
                        )
                    }
                    _ => {
                        let (al, li) = (self.r.param(), self.r.param());
                        (
                            format!("swiglu_oai(#{}, None, {al}, {li})", a.index()),
                            self.b.g.swiglu_oai(a, None, al, li),
                        )
                    }
                };
                self.rec(call, r).map(|_| ())
            }
            28 => {
                let a = self.src()?;
                let k = self.r.byte() % 8;
                let n_past = self.r.small();
                let (call, r) = match k {
                    0 => (
                        format!("diag_mask_inf(#{}, {n_past})", a.index()),
                        self.b.g.diag_mask_inf(a, n_past),
                    ),
                    1 => (
                        format!("diag_mask_inf_inplace(#{}, {n_past})", a.index()),
                        self.b.g.diag_mask_inf_inplace(a, n_past),
                    ),
                    2 => (
                        format!("diag_mask_zero(#{}, {n_past})", a.index()),
                        self.b.g.diag_mask_zero(a, n_past),
                    ),
                    3 => {
                        let t = self.r.pick(&[
                            TriType::Upper,
                            TriType::UpperDiag,
                            TriType::Lower,
                            TriType::LowerDiag,
                        ]);
                        (format!("tri(#{}, {t:?})", a.index()), self.b.g.tri(a, t))
                    }
                    _ => {
                        // set / acc: b written through strides at an offset.
                        let bn = [self.r.pick(&[1, 2, 4]), self.r.pick(&[1, 2]), 1, 1];
                        let b = self.input(DType::F32, &bn, Fill::Values)?;
                        let s = self.b.g.strides(a).unwrap();
                        let nb = if self.r.chance(160) {
                            [s[1], s[2], s[3]]
                        } else {
                            [self.r.below(9) * 4, self.r.below(40) * 4, self.r.below(80) * 4]
                        };
                        let off =
                            if self.r.chance(200) { 4 * self.r.below(6) } else { self.r.small() };
                        let g = &mut self.b.g;
                        let (name, r) = match k {
                            4 => ("set", g.set(a, b, nb, off)),
                            5 => ("acc", g.acc(a, b, nb, off)),
                            6 => ("acc_inplace", g.acc_inplace(a, b, nb, off)),
                            _ => ("set_1d", g.set_1d(a, b, off)),
                        };
                        (
                            format!(
                                "{name}(#{}, #{}, {}, {off})",
                                a.index(),
                                b.index(),
                                ne_str(&nb)
                            ),
                            r,
                        )
                    }
                };
                self.rec(call, r).map(|_| ())
            }
            _ => match self.r.byte() % 4 {
                0 => self.mul_mat_id_fresh(),
                1 => self.flash_attn_fresh(),
                _ => {
                    let a = self.src()?;
                    self.b.g.set_output(a).ok()?;
                    self.b.outputs.push(a);
                    self.log(format!("set_output(#{})", a.index()));
                    Some(())
                }
            },
        }
    }

    fn build(mut self) -> Built {
        while !self.r.done() && self.b.calls < MAX_CALLS {
            let _ = self.step();
        }
        // The last two tensors made are outputs as well.
        let n = self.b.pool.len();
        for &id in &self.b.pool[n.saturating_sub(2)..] {
            if self.b.g.set_output(id).is_ok() {
                self.b.outputs.push(id);
            }
        }
        self.b.outputs.sort();
        self.b.outputs.dedup();
        self.b
    }
}

/// One plan's results: the stage it stopped at and what it produced.
struct Run {
    plan: Result<(), String>,
    compute: Option<Result<(), Error>>,
    outputs: Vec<Result<Vec<u8>, String>>,
    states: Vec<Vec<u8>>,
}

fn run_plan(
    b: Built,
    be: &CpuBackend,
    guard: bool,
    compute: bool,
    label: &str,
    trace: &Trace,
) -> Run {
    let log = |s: String| push(trace, s);
    log(format!("plan {label}"));
    let plan = if guard { Plan::with_guards(b.g, be, GUARD) } else { Plan::new(b.g, be) };
    let mut plan = match plan {
        Ok(p) => p,
        Err(e) => {
            log(format!("plan {label} -> Err({e})"));
            return Run {
                plan: Err(e.to_string()),
                compute: None,
                outputs: vec![],
                states: vec![],
            };
        }
    };
    if !compute {
        return Run { plan: Ok(()), compute: None, outputs: vec![], states: vec![] };
    }
    for (id, data) in &b.inputs {
        // Inputs that no output needs are not inputs of the plan.
        let _ = plan.set_input_bytes(*id, data);
    }
    log(format!("compute {label}"));
    let r = plan.compute();
    log(format!("compute {label} -> {r:?}"));
    let mut run = Run { plan: Ok(()), compute: None, outputs: vec![], states: vec![] };
    if r.is_ok() {
        run.outputs = b
            .outputs
            .iter()
            .map(|&id| plan.output_bytes(id).map(|s| s.to_vec()).map_err(|e| e.to_string()))
            .collect();
        drop(plan);
        run.states = b
            .states
            .iter()
            .map(|s| {
                let mut v = vec![0u8; s.len()];
                s.read(0, &mut v).expect("state buffer is readable after compute");
                v
            })
            .collect();
    }
    run.compute = Some(r);
    run
}

fn first_diff(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("first difference at byte {i} of {}", a.len()),
        None => format!("lengths {} and {}", a.len(), b.len()),
    }
}

/// Builds, plans and computes the case read from `bytes`; `Err` describes a disagreement between
/// the runs, an op that panicked inside a worker, or an overwritten guard byte. The builder calls
/// and stages go to `trace` as they happen.
pub fn run_case(bytes: &[u8], trace: &Trace) -> Result<Outcome, String> {
    let tiers = backends();
    let (isa, be1, be2) = &tiers[bytes.first().map_or(0, |&b| b as usize) % tiers.len()];
    let body = bytes.get(1..).unwrap_or(&[]);
    push(trace, format!("tier {}", isa.name()));
    let built = Builder::new(body, Some(trace)).build();
    let mut out = Outcome { calls: built.calls, calls_ok: built.calls_ok, ..Outcome::default() };

    // Sizes decide how far the case goes.
    let mut max_elems = 0usize;
    let mut max_rows = 0usize;
    let mut max_bytes = 0usize;
    for &id in &built.pool {
        let ne = built.g.shape(id).unwrap();
        let n = ne.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).unwrap_or(usize::MAX);
        max_elems = max_elems.max(n);
        // An empty [0, 2^40] has 2^40 rows that a reduction may walk: legitimate work, but not
        // for a test that computes thousands of graphs.
        max_rows = max_rows.max(prod(&ne[1..]));
        let dt = built.g.dtype(id).unwrap();
        let b = dt
            .row_size(ne[0])
            .ok()
            .and_then(|r| ne[1..].iter().try_fold(r, |n, &d| n.checked_mul(d)))
            .unwrap_or(usize::MAX);
        max_bytes = max_bytes.max(b);
    }
    let compute = max_elems <= MAX_COMPUTE_ELEMS && max_rows <= MAX_COMPUTE_ROWS;
    if !compute && max_bytes < 1 << 45 {
        push(
            trace,
            format!("not planned: the largest tensor has {max_elems} elements, {max_bytes} bytes"),
        );
        return Ok(out);
    }
    out.planned = true;

    let b2 = Builder::new(body, None).build();
    let b3 = Builder::new(body, None).build();
    let a = run_plan(built, be1, false, compute, "1 thread", trace);
    let b = run_plan(b2, be2, false, compute, "2 threads", trace);
    let c = run_plan(b3, be2, true, compute, "2 threads, guarded", trace);

    if a.plan != b.plan || a.plan.is_ok() != c.plan.is_ok() {
        return Err(format!(
            "plans disagree: 1 thread {:?}, 2 threads {:?}, guarded {:?}",
            a.plan, b.plan, c.plan
        ));
    }
    out.plan_ok = a.plan.is_ok();
    let (Some(ra), Some(rb), Some(rc)) = (&a.compute, &b.compute, &c.compute) else {
        return Ok(out);
    };
    out.computed = true;
    for (r, label) in [(ra, "1 thread"), (rb, "2 threads"), (rc, "guarded")] {
        if let Err(e @ Error::Panicked { .. }) = r {
            return Err(format!("an op panicked ({label}): {e}"));
        }
        if let Err(e) = r
            && e.to_string().contains("guard byte")
        {
            return Err(format!("an op wrote outside its tensor ({label}): {e}"));
        }
    }
    if ra.is_ok() != rb.is_ok() || ra.is_ok() != rc.is_ok() {
        return Err(format!(
            "computes disagree: 1 thread {ra:?}, 2 threads {rb:?}, guarded {rc:?}"
        ));
    }
    out.compute_ok = ra.is_ok();
    if !out.compute_ok {
        return Ok(out);
    }
    for (i, ((oa, ob), oc)) in a.outputs.iter().zip(&b.outputs).zip(&c.outputs).enumerate() {
        match (oa, ob, oc) {
            (Ok(x), Ok(y), Ok(z)) => {
                if x != y {
                    return Err(format!(
                        "output {i}: 1 and 2 threads differ, {}",
                        first_diff(x, y)
                    ));
                }
                if x != z {
                    return Err(format!(
                        "output {i}: the guarded plan differs, {}",
                        first_diff(x, z)
                    ));
                }
            }
            (Err(x), Err(y), Err(z)) if x == y && x == z => {}
            _ => {
                return Err(format!(
                    "output {i} readable in some runs only: {oa:?} / {ob:?} / {oc:?}"
                ));
            }
        }
    }
    for (i, ((sa, sb), sc)) in a.states.iter().zip(&b.states).zip(&c.states).enumerate() {
        if sa != sb || sa != sc {
            return Err(format!(
                "state buffer {i} differs between runs: {}",
                first_diff(sa, if sa != sb { sb } else { sc })
            ));
        }
    }
    Ok(out)
}
