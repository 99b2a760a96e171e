//! Text generation on a scripted model (logits that pick a fixed sequence of tokens) with the
//! SmolLM2 tokenizer: stop at end tokens, stop strings held back while streaming, token limits;
//! and a synthetic llama driven through the same loop.

use quantgraph::models::generate::{CausalLm, GenerateParams, StopReason, generate};
use quantgraph::models::llama::{Llama, LlamaConfig, WeightTypes, synthetic_gguf};
use quantgraph::models::sampling::SamplerParams;
use quantgraph::tokenizer::Tokenizer;
use quantgraph::{CpuBackend, DType, GgufFile};
use std::path::Path;

mod common;

/// The shared tiny llama with SmolLM2's vocabulary, so its ids decode to text.
fn config(tok: &Tokenizer, n_ctx: usize) -> LlamaConfig {
    LlamaConfig { n_vocab: tok.n_tokens(), ..common::llama::tiny_config(n_ctx) }
}

fn smollm() -> Tokenizer {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer/smollm-vocab.gguf");
    Tokenizer::from_gguf(&GgufFile::open(p).unwrap()).unwrap()
}

/// Each call's logits pick the next token of `script`.
struct Scripted {
    script: Vec<u32>,
    n_vocab: usize,
    n_past: usize,
    calls: usize,
}

impl Scripted {
    fn new(tok: &Tokenizer, text_then: &str, end: Option<u32>) -> Scripted {
        let mut script = tok.encode(text_then, false, false);
        script.extend(end);
        Scripted { script, n_vocab: tok.n_tokens(), n_past: 0, calls: 0 }
    }
}

impl CausalLm for Scripted {
    fn n_vocab(&self) -> usize {
        self.n_vocab
    }
    fn n_ctx(&self) -> usize {
        1000
    }
    fn n_past(&self) -> usize {
        self.n_past
    }
    fn reset(&mut self) {
        self.n_past = 0;
    }
    fn eval_last(&mut self, tokens: &[u32]) -> quantgraph::Result<Vec<f32>> {
        self.n_past += tokens.len();
        let mut l = vec![0.0f32; self.n_vocab];
        l[self.script[self.calls.min(self.script.len() - 1)] as usize] = 10.0;
        self.calls += 1;
        Ok(l)
    }
}

fn run(
    m: &mut Scripted,
    tok: &Tokenizer,
    p: &GenerateParams,
) -> (quantgraph::models::generate::Generation, Vec<String>) {
    let prompt = tok.encode("Say:", true, true);
    let mut pieces = Vec::new();
    let g = generate(m, tok, &prompt, p, &mut |t| pieces.push(t.to_string())).unwrap();
    (g, pieces)
}

#[test]
fn stops_at_the_end_token_and_streams_everything_before_it() {
    let tok = smollm();
    let end = tok.token_id("<|im_end|>").unwrap();
    let mut m = Scripted::new(&tok, "Paris is lovely, 東京 too 🦙!", Some(end));
    let (g, pieces) = run(&mut m, &tok, &GenerateParams::default());
    assert_eq!(g.stop, StopReason::EndOfGeneration);
    assert_eq!(g.text, "Paris is lovely, 東京 too 🦙!");
    assert_eq!(pieces.concat(), g.text);
    // Streamed in more than one piece, none with a broken character.
    assert!(pieces.len() > 3 && pieces.iter().all(|p| !p.contains('\u{FFFD}')));
    assert_eq!(*g.tokens.last().unwrap(), end);
}

#[test]
fn stop_strings_cut_the_text_and_are_never_shown() {
    let tok = smollm();
    let mut m = Scripted::new(&tok, "one two\nUser: three", None);
    let mut p = GenerateParams::default();
    p.stop = vec!["\nUser:".to_string()];
    let (g, pieces) = run(&mut m, &tok, &p);
    assert_eq!(g.stop, StopReason::StopString);
    assert_eq!(g.text, "one two");
    assert_eq!(pieces.concat(), "one two");
}

#[test]
fn max_tokens_limits_generation() {
    let tok = smollm();
    let mut m = Scripted::new(&tok, "a b c d e f g h", None);
    let mut p = GenerateParams::default();
    p.max_tokens = 3;
    let (g, pieces) = run(&mut m, &tok, &p);
    assert_eq!(g.stop, StopReason::MaxTokens);
    assert_eq!(g.tokens.len(), 3);
    assert_eq!(g.text, "a b c");
    assert_eq!(pieces.concat(), g.text);
    // The prompt went in once, then one token per step, the last one not evaluated.
    assert_eq!(m.n_past, 2 + 2);
}

#[test]
fn synthetic_llama_generates_greedy_and_seeded_samples() {
    let tok = smollm();
    let cfg = config(&tok, 64);
    let file = GgufFile::from_vec(synthetic_gguf(&cfg, WeightTypes::all(DType::Q8_0), 5).unwrap())
        .unwrap();
    let backend = CpuBackend::with_threads(2).unwrap();
    let prompt = tok.encode("Hello world", true, true);
    let gen_with = |sampler: SamplerParams| {
        let mut model = Llama::from_gguf(&file, None, &backend).unwrap();
        let mut p = GenerateParams::default();
        p.max_tokens = 8;
        p.stop_at_eog = false;
        p.sampler = sampler;
        generate(&mut model, &tok, &prompt, &p, &mut |_| {}).unwrap()
    };
    let g = gen_with(SamplerParams::greedy());
    assert_eq!(g.tokens.len(), 8);
    // Greedy generation is the model's own argmax loop.
    let mut model = Llama::from_gguf(&file, None, &backend).unwrap();
    assert_eq!(model.generate(&prompt, 8).unwrap(), g.tokens);
    assert_eq!(g.text, tok.decode(&g.tokens, false));
    let mut s = SamplerParams::default();
    s.seed = 11;
    s.temperature = 1.5;
    s.top_k = 0;
    s.min_p = 0.0;
    assert_eq!(gen_with(s.clone()).tokens, gen_with(s).tokens);
}

#[test]
fn generation_stops_when_other_sequences_fill_the_shared_cache() {
    use quantgraph::models::llama::Batch;
    let tok = smollm();
    let cfg = config(&tok, 24);
    let file = GgufFile::from_vec(synthetic_gguf(&cfg, WeightTypes::all(DType::Q8_0), 3).unwrap())
        .unwrap();
    let backend = CpuBackend::with_threads(1).unwrap();
    let mut model = Llama::from_gguf(&file, None, &backend).unwrap();
    // Sequence 1 holds 16 of the 24 cells.
    let mut b = Batch::new();
    b.add_seq(1, &(0..16).map(|i| i + 100).collect::<Vec<u32>>(), true);
    model.forward_batch(&b).unwrap();
    assert_eq!(model.n_free_cells(), 8);
    let prompt = tok.encode("Hello world", true, true);
    let mut p = GenerateParams::default();
    p.max_tokens = 100;
    p.stop_at_eog = false;
    p.sampler = SamplerParams::greedy();
    let g = generate(&mut model, &tok, &prompt, &p, &mut |_| {}).unwrap();
    assert_eq!(g.stop, StopReason::ContextFull);
    // Every free cell was used: the prompt and all generated tokens but the last.
    assert_eq!(prompt.len() + g.tokens.len() - 1, 8);
    assert_eq!((model.seq_len(0), model.seq_len(1), model.n_free_cells()), (8, 16, 0));
}
