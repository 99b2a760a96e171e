//! Which architecture a GGUF file holds (`general.architecture`) and how to load it: every
//! supported architecture runs on the llama runner ([`Llama`]) with its differences
//! ([`ArchParams`]) read from the file, following llama.cpp's models (src/models/*.cpp).

use super::llama::{
    ArchParams, Llama, LlamaConfig, meta_f32, meta_usize, repacked_weights, weights_of,
};
use crate::backend::CpuBackend;
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, Value};
use crate::graph::RopeMode;

/// A decoder architecture this crate runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Architecture {
    /// `llama` (Llama, SmolLM, Mistral-style): RMS norm, rope, SwiGLU.
    Llama,
    /// `qwen2`: llama with Q/K/V biases and NeoX rope.
    Qwen2,
    /// `qwen3`: llama with per-head Q/K RMS norms and NeoX rope.
    Qwen3,
    /// `gemma3`: embeddings scaled by sqrt(n_embd), Q/K norms, norms after attention and
    /// feed-forward, GELU gate, sliding-window blocks with their own rope base.
    Gemma3,
}

impl Architecture {
    /// All supported architectures.
    pub const ALL: [Architecture; 4] =
        [Architecture::Llama, Architecture::Qwen2, Architecture::Qwen3, Architecture::Gemma3];

    /// The `general.architecture` name.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma3 => "gemma3",
        }
    }

    /// The architecture of a file; `Err` naming it when it is not supported.
    pub fn from_gguf(file: &GgufFile) -> Result<Architecture> {
        let name = file.metadata().get_str("general.architecture")?;
        Architecture::ALL.into_iter().find(|a| a.name() == name).ok_or_else(|| {
            let known: Vec<&str> = Architecture::ALL.iter().map(|a| a.name()).collect();
            Error::Gguf(format!(
                "architecture '{name}' is not supported (supported: {})",
                known.join(", ")
            ))
        })
    }

    /// The hyperparameters and architecture differences of a file of this architecture.
    /// `n_ctx` overrides the context length (the KV cache size).
    pub fn config(
        self,
        file: &GgufFile,
        n_ctx: Option<usize>,
    ) -> Result<(LlamaConfig, ArchParams)> {
        let p = self.name();
        let cfg = LlamaConfig::from_gguf_keys(file, n_ctx, p)?;
        let md = file.metadata();
        let mut a = ArchParams::default();
        let key_len = meta_usize(md, &format!("{p}.attention.key_length")).ok();
        a.head_dim = key_len.filter(|&k| k != cfg.head_dim());
        match self {
            Architecture::Llama => {}
            Architecture::Qwen2 | Architecture::Qwen3 => a.rope_mode = RopeMode::Neox,
            Architecture::Gemma3 => {
                a.rope_mode = RopeMode::Neox;
                a.embd_scale = (cfg.n_embd as f32).sqrt();
                a.ffn_gelu = true;
                let hd = key_len.unwrap_or(cfg.head_dim());
                a.attn_scale = Some(1.0 / (hd as f32).sqrt());
                a.swa_window =
                    meta_usize(md, &format!("{p}.attention.sliding_window")).unwrap_or(0);
                if a.swa_window > 0 {
                    a.rope_base_swa = meta_f32(md, &format!("{p}.rope.freq_base_swa"), 10000.0)?;
                    let key = format!("{p}.attention.sliding_window_pattern");
                    a.swa_layers = match md.get(&key) {
                        Some(Value::Array(_)) => md.get_arr::<bool>(&key)?.to_vec(),
                        _ => {
                            // Every n-th block is global (llama.cpp's set_swa_pattern).
                            let n = meta_usize(md, &key).unwrap_or(6);
                            (0..cfg.n_layer).map(|il| n == 0 || il % n < n - 1).collect()
                        }
                    };
                }
            }
        }
        Ok((cfg, a))
    }
}

/// Loads whatever decoder a GGUF file holds (see [`Architecture`]); the weights stay in the
/// file's memory-mapped buffer. `Err` names an unsupported architecture.
///
/// ```no_run
/// use quantgraph::{CpuBackend, GgufFile};
///
/// let file = GgufFile::open("model.gguf")?;
/// let model = quantgraph::models::load(&file, Some(2048), &CpuBackend::with_threads(4)?)?;
/// # let _ = model;
/// # Ok::<(), quantgraph::Error>(())
/// ```
pub fn load(file: &GgufFile, n_ctx: Option<usize>, backend: &CpuBackend) -> Result<Llama> {
    let (cfg, a) = Architecture::from_gguf(file)?.config(file, n_ctx)?;
    Llama::new_arch(cfg, a, &weights_of(file), backend)
}

/// Like [`load`], with the repackable matrices copied into the CPU_REPACK layout (see
/// [`Llama::from_gguf_repacked`]); also returns the bytes repacked.
pub fn load_repacked(
    file: &GgufFile,
    n_ctx: Option<usize>,
    backend: &CpuBackend,
) -> Result<(Llama, usize)> {
    let (cfg, a) = Architecture::from_gguf(file)?.config(file, n_ctx)?;
    let (weights, total) = repacked_weights(file)?;
    Ok((Llama::new_arch(cfg, a, &weights, backend)?, total))
}
