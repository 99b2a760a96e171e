//! Builders for the state-space, recurrent and misc forward ops (ggml.c's rules, plus the layout
//! assumptions ggml's CPU kernels make): ssm_conv, ssm_scan, rwkv_wkv6, gated_linear_attn,
//! rwkv_wkv7, solve_tri, gated_delta_net, lightning_indexer and the DeepSeek-V4 hyper-connection
//! ops. Every method checks types, shapes and parameters and returns `Err` naming the op, the
//! tensors and the values at fault; kernels then only see layouts they can index blindly.

use super::{Graph, Op, Tensor, TensorId, shape_str};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// hc (number of residual streams) the DeepSeek-V4 hyper-connection ops support, as ggml.
const DSV4_HC: usize = 4;

impl Graph {
    /// The tensor `id`, which must be F32.
    fn rec_f32(&self, op: &'static str, what: &str, id: TensorId) -> Result<&Tensor> {
        let t = self.get(op, id)?;
        if t.dtype != DType::F32 {
            return Err(Error::ty(op, format!("{what} {} must be F32", t.describe(id))));
        }
        Ok(t)
    }

    /// The F32 tensor `id`, which must also be contiguous.
    fn rec_f32_contig(&self, op: &'static str, what: &str, id: TensorId) -> Result<&Tensor> {
        let t = self.rec_f32(op, what, id)?;
        if !t.is_contiguous() {
            return Err(Error::shape(op, format!("{what} {} must be contiguous", t.describe(id))));
        }
        Ok(t)
    }

    /// ggml_ssm_conv: `sx` [d_conv - 1 + n_t, d_inner, n_s] (F32, rows contiguous) convolved with
    /// `c` [d_conv, d_inner] (F32, contiguous) along dim 0 -> [d_inner, n_t, n_s]:
    /// `y[i, t, s] = sum_k sx[t + k, i, s] * c[k, i]`.
    pub fn ssm_conv(&mut self, sx: TensorId, c: TensorId) -> Result<TensorId> {
        const OP: &str = "ssm_conv";
        let ts = self.rec_f32(OP, "sx", sx)?;
        let tc = self.rec_f32_contig(OP, "c", c)?;
        let (d_conv, d_inner) = (tc.ne[0], tc.ne[1]);
        if ts.ne[3] != 1 || tc.ne[2] != 1 || tc.ne[3] != 1 {
            return Err(Error::shape(
                OP,
                format!("sx {} must be 3-D and c {} a matrix", ts.describe(sx), tc.describe(c)),
            ));
        }
        if d_conv == 0 || ts.ne[1] != d_inner || ts.ne[0] + 1 < d_conv {
            return Err(Error::shape(
                OP,
                format!(
                    "sx {} does not fit c {}: need sx.ne[1] == d_inner = {d_inner} and sx.ne[0] >= d_conv - 1 = {}",
                    ts.describe(sx),
                    tc.describe(c),
                    d_conv.saturating_sub(1)
                ),
            ));
        }
        if !ts.rows_contiguous() || ts.nb[1] != ts.ne[0] * 4 {
            return Err(Error::shape(
                OP,
                format!(
                    "sx {} must have contiguous, packed rows (nb[1] = ne[0] * 4)",
                    ts.describe(sx)
                ),
            ));
        }
        let n_t = ts.ne[0] + 1 - d_conv;
        let n_s = ts.ne[2];
        self.node(Op::SsmConv, DType::F32, [d_inner, n_t, n_s, 1], &[sx, c])
    }

    /// ggml_ssm_scan: the selective scan of Mamba-1 (`a` [d_state, n_head], head_dim 1) and Mamba-2
    /// (`a` [1, n_head], scalar decay per head).
    ///
    /// Shapes: `s` [d_state, head_dim, n_head, >= n_seqs] initial states (contiguous), `x`
    /// [head_dim, n_head, n_seq_tokens, n_seqs], `dt` [n_head, n_seq_tokens, n_seqs] (contiguous),
    /// `b`, `c` [d_state, n_group, n_seq_tokens, n_seqs] with `n_head % n_group == 0`, `ids`
    /// \[n_seqs\] I32 (row of `s` each sequence starts from). `x`, `b` and `c` need packed rows
    /// (dims 0 and 1) but may be overlapping views of one tensor. `k` >= 1 state snapshots are
    /// kept (Mamba-2 only when `k > 1`).
    ///
    /// The F32 result is 1-D: y [head_dim, n_head, n_seq_tokens, n_seqs] followed by `k` slots of
    /// final states [d_state, head_dim, n_head, n_seqs]; slot 0 is the state after the last token,
    /// slot `j` the state `j` tokens earlier. Slots older than the token count are zero-filled
    /// (ggml leaves them unwritten).
    #[allow(clippy::too_many_arguments)]
    pub fn ssm_scan(
        &mut self,
        s: TensorId,
        x: TensorId,
        dt: TensorId,
        a: TensorId,
        b: TensorId,
        c: TensorId,
        ids: TensorId,
        k: usize,
    ) -> Result<TensorId> {
        const OP: &str = "ssm_scan";
        if k == 0 || k > i32::MAX as usize {
            return Err(Error::param(OP, format!("K = {k} must be in 1..=2^31-1")));
        }
        let ts = self.rec_f32_contig(OP, "s", s)?;
        let tx = self.rec_f32(OP, "x", x)?;
        let tdt = self.rec_f32_contig(OP, "dt", dt)?;
        let ta = self.rec_f32_contig(OP, "A", a)?;
        let tb = self.rec_f32(OP, "B", b)?;
        let tcc = self.rec_f32(OP, "C", c)?;
        let tids = self.get(OP, ids)?;
        if tids.dtype != DType::I32 {
            return Err(Error::ty(OP, format!("ids {} must be I32", tids.describe(ids))));
        }
        for (what, t, id) in [("x", tx, x), ("B", tb, b), ("C", tcc, c)] {
            if t.nb[0] != 4 || t.nb[1] != t.ne[0] * 4 {
                return Err(Error::shape(
                    OP,
                    format!("{what} {} needs packed dims 0 and 1", t.describe(id)),
                ));
            }
        }
        let (d_state, head_dim, n_head, n_tok, n_seqs) =
            (ts.ne[0], tx.ne[0], tx.ne[1], tx.ne[2], tx.ne[3]);
        let n_group = tb.ne[1];
        let bad = |msg: String| Err(Error::shape(OP, msg));
        if tb.ne != tcc.ne {
            return bad(format!("B {} and C {} differ", tb.describe(b), tcc.describe(c)));
        }
        if tdt.ne != [n_head, n_tok, n_seqs, 1] {
            return bad(format!(
                "dt {} must be [n_head, n_seq_tokens, n_seqs] = {}",
                tdt.describe(dt),
                shape_str(&[n_head, n_tok, n_seqs, 1])
            ));
        }
        if ts.ne[1] != head_dim || ts.ne[2] != n_head {
            return bad(format!(
                "s {} must be [d_state, head_dim = {head_dim}, n_head = {n_head}, n]",
                ts.describe(s)
            ));
        }
        if tb.ne[0] != d_state || tb.ne[2] != n_tok || tb.ne[3] != n_seqs {
            return bad(format!(
                "B {} must be [d_state = {d_state}, n_group, n_seq_tokens = {n_tok}, n_seqs = {n_seqs}]",
                tb.describe(b)
            ));
        }
        if n_group == 0 || n_head % n_group != 0 {
            return bad(format!("n_head = {n_head} is not a multiple of n_group = {n_group}"));
        }
        if tids.ne != [n_seqs, 1, 1, 1] || tids.nb[0] != 4 {
            return bad(format!(
                "ids {} must be a packed [n_seqs = {n_seqs}] vector",
                tids.describe(ids)
            ));
        }
        if ta.ne[1] != n_head || ta.ne[2] != 1 || ta.ne[3] != 1 {
            return bad(format!("A {} must be [1 or d_state, n_head = {n_head}]", ta.describe(a)));
        }
        if ta.ne[0] != 1 {
            if ta.ne[0] != d_state {
                return bad(format!(
                    "A {} must be [1, n_head] (Mamba-2) or [d_state = {d_state}, n_head] (Mamba-1)",
                    ta.describe(a)
                ));
            }
            if k != 1 {
                return Err(Error::param(
                    OP,
                    format!("K = {k}: Mamba-1 (A [d_state, n_head]) needs K = 1"),
                ));
            }
        }
        let states = [d_state, head_dim, n_head, n_seqs, k]
            .iter()
            .try_fold(1usize, |acc, &n| acc.checked_mul(n))
            .ok_or(Error::Overflow { what: "ssm_scan result" })?;
        let n = tx
            .nelements()
            .checked_add(states)
            .ok_or(Error::Overflow { what: "ssm_scan result" })?;
        self.node(Op::SsmScan { k }, DType::F32, [n, 1, 1, 1], &[s, x, dt, a, b, c, ids])
    }

    /// Checks the per-token inputs of the RWKV/GLA recurrences: each [S, H, T] F32 contiguous; the
    /// state with S*S*H*n_seqs elements (n_seqs = state.ne[1]) and T a multiple of n_seqs.
    fn rec_linear_attn(
        &self,
        op: &'static str,
        tokens: &[(&str, TensorId)],
        state: TensorId,
    ) -> Result<([usize; 3], usize)> {
        let (first_name, first) = tokens[0];
        let t0 = self.rec_f32_contig(op, first_name, first)?;
        let (s, h, t) = (t0.ne[0], t0.ne[1], t0.ne[2]);
        for &(what, id) in tokens {
            let tt = self.rec_f32_contig(op, what, id)?;
            if tt.ne != [s, h, t, 1] {
                return Err(Error::shape(
                    op,
                    format!(
                        "{what} {} must be [S, H, n_tokens] = {} like {first_name}",
                        tt.describe(id),
                        shape_str(&[s, h, t, 1])
                    ),
                ));
            }
        }
        let ts = self.rec_f32_contig(op, "state", state)?;
        let n_seqs = ts.ne[1];
        let want = [s, s, h, n_seqs].iter().try_fold(1usize, |a, &n| a.checked_mul(n));
        if n_seqs == 0 || want != Some(ts.nelements()) || t % n_seqs != 0 {
            return Err(Error::shape(
                op,
                format!(
                    "state {} must hold S*S*H*n_seqs elements (S = {s}, H = {h}, n_seqs = ne[1] = {n_seqs}) and n_tokens = {t} must be a multiple of n_seqs",
                    ts.describe(state)
                ),
            ));
        }
        Ok(([s, h, t], n_seqs))
    }

    /// Result [S*H, n_tokens + S*n_seqs] of the RWKV/GLA recurrences: outputs then new states.
    fn rec_linear_attn_node(
        &mut self,
        op: Op,
        [s, h, t]: [usize; 3],
        n_seqs: usize,
        srcs: &[TensorId],
    ) -> Result<TensorId> {
        let rows = s.checked_mul(n_seqs).and_then(|r| r.checked_add(t));
        let cols = s.checked_mul(h);
        match (rows, cols) {
            (Some(r), Some(c)) => self.node(op, DType::F32, [c, r, 1, 1], srcs),
            _ => Err(Error::Overflow { what: "recurrent result" }),
        }
    }

    /// ggml_rwkv_wkv6: RWKV-6 time mixing. `k`, `v`, `r`, `td` (time decay) are [S, H, n_tokens],
    /// `tf` (time_first / u) holds S*H values, `state` S*S*H*n_seqs (ne\[1\] = n_seqs); all F32 and
    /// contiguous, tokens grouped by sequence. Result [S*H, n_tokens + S*n_seqs]: the outputs,
    /// then the new states.
    pub fn rwkv_wkv6(
        &mut self,
        k: TensorId,
        v: TensorId,
        r: TensorId,
        tf: TensorId,
        td: TensorId,
        state: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "rwkv_wkv6";
        let (shape, n_seqs) =
            self.rec_linear_attn(OP, &[("k", k), ("v", v), ("r", r), ("td", td)], state)?;
        let ttf = self.rec_f32_contig(OP, "tf", tf)?;
        if ttf.nelements() != shape[0] * shape[1] {
            return Err(Error::shape(
                OP,
                format!("tf {} must hold S*H = {} values", ttf.describe(tf), shape[0] * shape[1]),
            ));
        }
        self.rec_linear_attn_node(Op::RwkvWkv6, shape, n_seqs, &[k, v, r, tf, td, state])
    }

    /// ggml_gated_linear_attn: `k`, `v`, `q`, `g` [S, H, n_tokens], `state` S*S*H*n_seqs; all F32
    /// and contiguous. `s' = s * g + k v^T`, `o = (q * scale) s'`. Result as [`Graph::rwkv_wkv6`].
    pub fn gated_linear_attn(
        &mut self,
        k: TensorId,
        v: TensorId,
        q: TensorId,
        g: TensorId,
        state: TensorId,
        scale: f32,
    ) -> Result<TensorId> {
        const OP: &str = "gated_linear_attn";
        if !scale.is_finite() {
            return Err(Error::param(OP, format!("scale = {scale} must be finite")));
        }
        let (shape, n_seqs) =
            self.rec_linear_attn(OP, &[("k", k), ("v", v), ("q", q), ("g", g)], state)?;
        self.rec_linear_attn_node(
            Op::GatedLinearAttn { scale },
            shape,
            n_seqs,
            &[k, v, q, g, state],
        )
    }

    /// ggml_rwkv_wkv7: `r`, `w`, `k`, `v`, `a`, `b` [S, H, n_tokens], `state` S*S*H*n_seqs; all
    /// F32 and contiguous. `s' = s diag(w) + v k^T + (s a) b^T`, `o = s' r`. Result as
    /// [`Graph::rwkv_wkv6`].
    #[allow(clippy::too_many_arguments)]
    pub fn rwkv_wkv7(
        &mut self,
        r: TensorId,
        w: TensorId,
        k: TensorId,
        v: TensorId,
        a: TensorId,
        b: TensorId,
        state: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "rwkv_wkv7";
        let (shape, n_seqs) = self.rec_linear_attn(
            OP,
            &[("k", k), ("r", r), ("w", w), ("v", v), ("a", a), ("b", b)],
            state,
        )?;
        self.rec_linear_attn_node(Op::RwkvWkv7, shape, n_seqs, &[r, w, k, v, a, b, state])
    }

    /// ggml_solve_tri: X with A X = B, A [n, n, p, q] triangular, B [k, n, p, q], both F32 and
    /// contiguous (element (col, row) of B is `b[col + k * row]`). As in ggml only `left`,
    /// `lower`, non-`uni` is implemented; other variants return `Err`. A zero on the diagonal gives
    /// inf/NaN, as in ggml.
    pub fn solve_tri(
        &mut self,
        a: TensorId,
        b: TensorId,
        left: bool,
        lower: bool,
        uni: bool,
    ) -> Result<TensorId> {
        const OP: &str = "solve_tri";
        if !(left && lower && !uni) {
            return Err(Error::param(
                OP,
                format!(
                    "left = {left}, lower = {lower}, uni = {uni}: only left, lower, non-unit is supported (as ggml)"
                ),
            ));
        }
        let ta = self.rec_f32_contig(OP, "a", a)?;
        let tb = self.rec_f32_contig(OP, "b", b)?;
        if ta.ne[0] != ta.ne[1]
            || ta.ne[1] != tb.ne[1]
            || ta.ne[2] != tb.ne[2]
            || ta.ne[3] != tb.ne[3]
        {
            return Err(Error::shape(
                OP,
                format!(
                    "a {} must be square [n, n, p, q] and b {} [k, n, p, q]",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        let ne = tb.ne;
        self.node(Op::SolveTri, DType::F32, ne, &[a, b])
    }

    /// ggml_gated_delta_net: the gated delta rule over `n_tokens` tokens of `n_seqs` sequences.
    ///
    /// Shapes: `q`, `k` [S, H_k, n_tokens, n_seqs_qk] (packed rows; H_v % H_k == 0 and
    /// n_seqs % n_seqs_qk == 0, heads tiled), `v` [S, H_v, n_tokens, n_seqs] (packed rows), `g`
    /// [1 or S, H_v, n_tokens, n_seqs] (scalar gate, or per-channel for KDA), `beta`
    /// [1, H_v, n_tokens, n_seqs], `state` [S, S, H_v, n_seqs] (transposed: `state[j*S + i]` is
    /// S\[i\]\[j\]); all F32, `g`, `beta`, `state` contiguous. `k` >= 1 snapshot slots.
    ///
    /// Result F32 [S*H_v, n_tokens*n_seqs + k*S*n_seqs]: the outputs [S, H_v, n_tokens, n_seqs]
    /// then `k` state slots (slot 0 final, slot j the state j tokens back). Slots older than the
    /// token count are zero-filled (ggml leaves them unwritten).
    #[allow(clippy::too_many_arguments)]
    pub fn gated_delta_net(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        g: TensorId,
        beta: TensorId,
        state: TensorId,
        n_snap: usize,
    ) -> Result<TensorId> {
        const OP: &str = "gated_delta_net";
        if n_snap == 0 || n_snap > i32::MAX as usize {
            return Err(Error::param(OP, format!("K = {n_snap} must be in 1..=2^31-1")));
        }
        let tq = self.rec_f32(OP, "q", q)?;
        let tk = self.rec_f32(OP, "k", k)?;
        let tv = self.rec_f32(OP, "v", v)?;
        let tg = self.rec_f32_contig(OP, "g", g)?;
        let tbeta = self.rec_f32_contig(OP, "beta", beta)?;
        let tst = self.rec_f32_contig(OP, "state", state)?;
        for (what, t, id) in [("q", tq, q), ("k", tk, k), ("v", tv, v)] {
            if !t.rows_contiguous() {
                return Err(Error::shape(
                    OP,
                    format!("{what} {} needs contiguous rows", t.describe(id)),
                ));
            }
        }
        let [sv, h, nt, ns] = tv.ne;
        let bad = |msg: String| Err(Error::shape(OP, msg));
        if sv == 0 {
            return bad(format!("v {} has head size 0", tv.describe(v)));
        }
        if tq.ne != tk.ne
            || tq.ne[0] != sv
            || tq.ne[1] == 0
            || h % tq.ne[1] != 0
            || tq.ne[2] != nt
            || tq.ne[3] == 0
            || ns % tq.ne[3] != 0
        {
            return bad(format!(
                "q {} and k {} must be equal, [S = {sv}, H_k | {h}, n_tokens = {nt}, n | {ns}] (v {})",
                tq.describe(q),
                tk.describe(k),
                tv.describe(v)
            ));
        }
        if (tg.ne[0] != 1 && tg.ne[0] != sv) || tg.ne[1..] != [h, nt, ns] {
            return bad(format!("g {} must be [1 or {sv}, {h}, {nt}, {ns}]", tg.describe(g)));
        }
        if tbeta.ne != [1, h, nt, ns] {
            return bad(format!("beta {} must be [1, {h}, {nt}, {ns}]", tbeta.describe(beta)));
        }
        if tst.ne != [sv, sv, h, ns] {
            return bad(format!("state {} must be [{sv}, {sv}, {h}, {ns}]", tst.describe(state)));
        }
        let rows = [n_snap, sv, ns]
            .iter()
            .try_fold(1usize, |a, &n| a.checked_mul(n))
            .and_then(|r| nt.checked_mul(ns).and_then(|t| t.checked_add(r)));
        let cols = sv.checked_mul(h);
        let (Some(rows), Some(cols)) = (rows, cols) else {
            return Err(Error::Overflow { what: "gated_delta_net result" });
        };
        self.node(
            Op::GatedDeltaNet { k: n_snap },
            DType::F32,
            [cols, rows, 1, 1],
            &[q, k, v, g, beta, state],
        )
    }

    /// ggml_lightning_indexer (DeepSeek sparse attention):
    /// `res[kv, t, 0, s] = sum_h relu(q[:, h, t, s] . k[:, 0, kv, s]) * weights[h, t, 0, s]
    /// + mask\[kv, t, 0, s % mask.ne\[3\]\]`.
    ///
    /// `q` [n_embd, n_head, n_batch, ne3] F32, `k` [n_embd, 1, n_kv, ne3] in F32 or any type with
    /// an f32 conversion (F16, BF16, quantized), `weights` [n_head, n_batch, 1, ne3] F32
    /// (prescaled), `mask` [n_kv, n_batch, 1, ne33] F16 with ne3 % ne33 == 0; all with packed
    /// rows. Result [n_kv, n_batch, 1, ne3] F32.
    pub fn lightning_indexer(
        &mut self,
        q: TensorId,
        k: TensorId,
        weights: TensorId,
        mask: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "lightning_indexer";
        let tq = self.rec_f32(OP, "q", q)?;
        let tw = self.rec_f32(OP, "weights", weights)?;
        let tk = self.get(OP, k)?;
        let tm = self.get(OP, mask)?;
        if tm.dtype != DType::F16 {
            return Err(Error::ty(OP, format!("mask {} must be F16", tm.describe(mask))));
        }
        if tk.dtype != DType::F32
            && tk.dtype != DType::F16
            && crate::quant::format(tk.dtype).dequantize.is_none()
        {
            return Err(Error::ty(OP, format!("k {} has no conversion to f32", tk.describe(k))));
        }
        for (what, t, id) in
            [("q", tq, q), ("k", tk, k), ("weights", tw, weights), ("mask", tm, mask)]
        {
            if !t.rows_contiguous() {
                return Err(Error::shape(
                    OP,
                    format!("{what} {} needs contiguous rows", t.describe(id)),
                ));
            }
        }
        let ok = tq.ne[0] == tk.ne[0]
            && tm.ne[0] == tk.ne[2]
            && tq.ne[1] == tw.ne[0]
            && tk.ne[1] == 1
            && tm.ne[1] == tq.ne[2]
            && tq.ne[2] == tw.ne[1]
            && tw.ne[2] == 1
            && tm.ne[2] == 1
            && tq.ne[3] == tk.ne[3]
            && tk.ne[3] == tw.ne[3]
            && tm.ne[3] != 0
            && tw.ne[3] % tm.ne[3] == 0;
        if !ok {
            return Err(Error::shape(
                OP,
                format!(
                    "shapes do not fit: q {} must be [e, h, b, s], k {} [e, 1, kv, s], weights {} [h, b, 1, s], mask {} [kv, b, 1, s'] with s % s' == 0",
                    tq.describe(q),
                    tk.describe(k),
                    tw.describe(weights),
                    tm.describe(mask)
                ),
            ));
        }
        let ne = [tk.ne[2], tq.ne[2], 1, tq.ne[3]];
        self.node(Op::LightningIndexer, DType::F32, ne, &[q, k, weights, mask])
    }

    /// ggml_dsv4_hc_comb: `mixes` [(2 + hc) * hc, n_tokens], `scale` [>= 3], `base` [(2 + hc) * hc],
    /// all F32, hc = 4. `logits[d, s, t] = mixes[2hc + d + hc s, t] * scale[2] + base[2hc + d + hc s]`;
    /// softmax over d, `+ eps`, normalise over s, then `n_iter - 1` more rounds of normalising over
    /// d then s (each sum with `+ eps`). Result [hc, hc, n_tokens]. `n_iter` is 1 to
    /// [`DSV4_HC_MAX_ITER`](crate::DSV4_HC_MAX_ITER) (DeepSeek-V4 uses 20).
    pub fn dsv4_hc_comb(
        &mut self,
        mixes: TensorId,
        scale: TensorId,
        base: TensorId,
        eps: f32,
        n_iter: i32,
    ) -> Result<TensorId> {
        const OP: &str = "dsv4_hc_comb";
        if n_iter <= 0 || n_iter > super::DSV4_HC_MAX_ITER || !eps.is_finite() {
            return Err(Error::param(
                OP,
                format!(
                    "n_iter = {n_iter} must be 1 to {} and eps = {eps} finite",
                    super::DSV4_HC_MAX_ITER
                ),
            ));
        }
        let tm = self.rec_f32(OP, "mixes", mixes)?;
        let ts = self.rec_f32(OP, "scale", scale)?;
        let tb = self.rec_f32(OP, "base", base)?;
        let dim = (2 + DSV4_HC) * DSV4_HC;
        if tm.ne[0] != dim || tm.ne[2] != 1 || tm.ne[3] != 1 {
            return Err(Error::shape(
                OP,
                format!(
                    "mixes {} must be [(2 + hc) * hc = {dim}, n_tokens] (hc = 4 only, as ggml)",
                    tm.describe(mixes)
                ),
            ));
        }
        if ts.ne[0] < 3 || ts.ne[1..] != [1, 1, 1] || tb.ne != [dim, 1, 1, 1] {
            return Err(Error::shape(
                OP,
                format!(
                    "scale {} must be [>= 3] and base {} [{dim}]",
                    ts.describe(scale),
                    tb.describe(base)
                ),
            ));
        }
        let nt = tm.ne[1];
        self.node(
            Op::Dsv4HcComb { eps, n_iter: n_iter as u32 },
            DType::F32,
            [DSV4_HC, DSV4_HC, nt, 1],
            &[mixes, scale, base],
        )
    }

    /// ggml_dsv4_hc_pre: `x` [n_embd, hc, n_tokens], `weights` [hc, n_tokens], both F32 ->
    /// [n_embd, n_tokens] with `res[i, t] = sum_h x[i, h, t] * weights[h, t]`.
    pub fn dsv4_hc_pre(&mut self, x: TensorId, weights: TensorId) -> Result<TensorId> {
        const OP: &str = "dsv4_hc_pre";
        let tx = self.rec_f32(OP, "x", x)?;
        let tw = self.rec_f32(OP, "weights", weights)?;
        let [n_embd, hc, nt, n3] = tx.ne;
        if hc == 0 || n3 != 1 || tw.ne != [hc, nt, 1, 1] {
            return Err(Error::shape(
                OP,
                format!(
                    "x {} must be [n_embd, hc, n_tokens] and weights {} [hc, n_tokens]",
                    tx.describe(x),
                    tw.describe(weights)
                ),
            ));
        }
        let op = Op::Dsv4HcPre { scale: 1.0, gated: false };
        self.node(op, DType::F32, [n_embd, nt, 1, 1], &[x, weights])
    }

    /// ggml_dsv4_hc_pre_gated: the pre-mix with a gate per element. `x` and `gate` [n_embd, hc,
    /// n_tokens], both F32 -> [n_embd, n_tokens] with
    /// `res[i, t] = scale * sum_h x[i, h, t] * sigmoid(gate[i, h, t])`.
    pub fn dsv4_hc_pre_gated(
        &mut self,
        x: TensorId,
        gate: TensorId,
        scale: f32,
    ) -> Result<TensorId> {
        const OP: &str = "dsv4_hc_pre_gated";
        if !scale.is_finite() {
            return Err(Error::param(OP, format!("scale = {scale} must be finite")));
        }
        let tx = self.rec_f32(OP, "x", x)?;
        let tg = self.rec_f32(OP, "gate", gate)?;
        let [n_embd, hc, nt, n3] = tx.ne;
        if hc == 0 || n3 != 1 || tg.ne != tx.ne {
            return Err(Error::shape(
                OP,
                format!(
                    "x {} must be [n_embd, hc, n_tokens] and gate {} the same shape",
                    tx.describe(x),
                    tg.describe(gate)
                ),
            ));
        }
        self.node(Op::Dsv4HcPre { scale, gated: true }, DType::F32, [n_embd, nt, 1, 1], &[x, gate])
    }

    /// ggml_dsv4_hc_post: `x` [n_embd, n_tokens], `residual` [n_embd, hc, n_tokens], `post`
    /// [hc, n_tokens], `comb` [hc, hc, n_tokens], all F32 -> [n_embd, hc, n_tokens] with
    /// `res[i, d, t] = x[i, t] * post[d, t] + sum_s residual[i, s, t] * comb[d, s, t]`. Without
    /// `comb` the mix is the identity: `res[i, d, t] = x[i, t] * post[d, t] + residual[i, d, t]`.
    pub fn dsv4_hc_post(
        &mut self,
        x: TensorId,
        residual: TensorId,
        post: TensorId,
        comb: Option<TensorId>,
    ) -> Result<TensorId> {
        const OP: &str = "dsv4_hc_post";
        let tx = self.rec_f32(OP, "x", x)?;
        let tr = self.rec_f32(OP, "residual", residual)?;
        let tp = self.rec_f32(OP, "post", post)?;
        let tc = comb.map(|c| self.rec_f32(OP, "comb", c)).transpose()?;
        let [n_embd, nt, x2, x3] = tx.ne;
        let hc = tr.ne[1];
        if hc == 0
            || x2 != 1
            || x3 != 1
            || tr.ne != [n_embd, hc, nt, 1]
            || tp.ne != [hc, nt, 1, 1]
            || tc.as_ref().is_some_and(|tc| tc.ne != [hc, hc, nt, 1])
        {
            let comb_desc = match (&tc, comb) {
                (Some(tc), Some(c)) => tc.describe(c),
                _ => "(none)".to_string(),
            };
            return Err(Error::shape(
                OP,
                format!(
                    "x {} must be [n_embd, n_tokens], residual {} [n_embd, hc, n_tokens], post {} [hc, n_tokens], comb {comb_desc} [hc, hc, n_tokens]",
                    tx.describe(x),
                    tr.describe(residual),
                    tp.describe(post),
                ),
            ));
        }
        let mut src = [None; super::MAX_SRC];
        src[..4].copy_from_slice(&[Some(x), Some(residual), Some(post), comb]);
        self.node_opt(Op::Dsv4HcPost, DType::F32, [n_embd, hc, nt, 1], &src)
    }
}
