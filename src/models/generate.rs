//! Text generation: a model and a tokenizer, a prompt, a sampler, stop rules; text streamed as
//! it is produced. Also the ChatML prompt format of chat models (`<|im_start|>role ...`).

use super::sampling::{Sampler, SamplerParams};
use crate::error::{Error, Result};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use std::time::Instant;

/// A causal language model with a KV cache: what [`generate`] drives.
pub trait CausalLm {
    /// Size of a row of logits.
    fn n_vocab(&self) -> usize;
    /// Tokens the cache can hold.
    fn n_ctx(&self) -> usize;
    /// Tokens already in the cache.
    fn n_past(&self) -> usize;
    /// Cells still free for new tokens of this sequence: `n_ctx - n_past` unless the cache also
    /// holds other sequences.
    fn n_free(&self) -> usize {
        self.n_ctx().saturating_sub(self.n_past())
    }
    /// Forgets the cache.
    fn reset(&mut self);
    /// Runs `tokens` after what is cached and returns the logits of the last one.
    fn eval_last(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
}

impl CausalLm for super::llama::Llama {
    fn n_vocab(&self) -> usize {
        self.config().n_vocab
    }

    fn n_ctx(&self) -> usize {
        self.config().n_ctx
    }

    fn n_past(&self) -> usize {
        super::llama::Llama::n_past(self)
    }

    fn n_free(&self) -> usize {
        // Sequence 0 is the one generated; it stops at its own context or when the cells shared
        // with other sequences run out.
        let n_ctx = self.config().n_ctx;
        n_ctx.saturating_sub(self.n_past()).min(self.n_free_cells())
    }

    fn reset(&mut self) {
        super::llama::Llama::reset(self)
    }

    fn eval_last(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.forward_last(tokens)
    }
}

/// Generation settings.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How the next token is picked.
    pub sampler: SamplerParams,
    /// Generation stops when the text contains one of these; the text ends before it.
    pub stop: Vec<String>,
    /// Stop at an end-of-generation token (EOS, `<|im_end|>`, ...), which is not shown.
    pub stop_at_eog: bool,
    /// Show control tokens the model produces as text.
    pub show_special: bool,
}

impl Default for GenerateParams {
    /// 128 tokens, greedy, stop at end-of-generation tokens.
    fn default() -> GenerateParams {
        GenerateParams {
            max_tokens: 128,
            sampler: SamplerParams::greedy(),
            stop: Vec::new(),
            stop_at_eog: true,
            show_special: false,
        }
    }
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfGeneration,
    /// The text reached a stop string.
    StopString,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The KV cache is full.
    ContextFull,
}

/// What [`generate`] produced.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The generated text (without the prompt, without a stop string or end token).
    pub text: String,
    /// The generated tokens, including an end token or the tokens of a stop string.
    pub tokens: Vec<u32>,
    /// Why it stopped.
    pub stop: StopReason,
    /// Prompt tokens evaluated.
    pub n_prompt: usize,
    /// Seconds spent on the prompt (up to the first token's logits).
    pub prefill_secs: f64,
    /// Seconds spent on the tokens after the first.
    pub decode_secs: f64,
}

/// Generates text after `prompt` (token ids, e.g. from [`Tokenizer::encode`]), calling
/// `on_text` with each piece of text as soon as it is final: text that could still turn into a
/// stop string is held back until it cannot. The model's cache continues from where it is.
pub fn generate(
    model: &mut impl CausalLm,
    tok: &Tokenizer,
    prompt: &[u32],
    params: &GenerateParams,
    on_text: &mut dyn FnMut(&str),
) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(Error::arg("generate: empty prompt"));
    }
    if params.stop.iter().any(String::is_empty) {
        return Err(Error::arg("generate: empty stop string"));
    }
    let mut sampler = Sampler::new(params.sampler.clone())?;
    for &t in prompt {
        sampler.accept(t);
    }
    let t0 = Instant::now();
    let mut logits = model.eval_last(prompt)?;
    let prefill_secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut dec = StreamDecoder::new();
    let (mut text, mut shown) = (String::new(), 0usize);
    let mut tokens = Vec::new();
    let stop = loop {
        if tokens.len() == params.max_tokens {
            break StopReason::MaxTokens;
        }
        let nv = model.n_vocab();
        let id = sampler.sample(&logits[logits.len().saturating_sub(nv)..])?;
        sampler.accept(id);
        tokens.push(id);
        if params.stop_at_eog && tok.is_eog(id) {
            break StopReason::EndOfGeneration;
        }
        text.push_str(&dec.push(tok, id, params.show_special)?);
        if let Some(p) = params.stop.iter().filter_map(|s| text.find(s.as_str())).min() {
            text.truncate(p);
            break StopReason::StopString;
        }
        // Show what can no longer become the start of a stop string.
        let hold = params
            .stop
            .iter()
            .map(|s| {
                (1..s.len())
                    .rev()
                    .find(|&n| s.is_char_boundary(n) && text.ends_with(&s[..n]))
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let upto = text.len() - hold;
        if upto > shown {
            on_text(&text[shown..upto]);
            shown = upto;
        }
        if tokens.len() == params.max_tokens {
            break StopReason::MaxTokens;
        }
        if model.n_free() == 0 {
            break StopReason::ContextFull;
        }
        logits = model.eval_last(&[id])?;
    };
    if stop != StopReason::StopString {
        text.push_str(&dec.flush());
    }
    if text.len() > shown {
        on_text(&text[shown..]);
    }
    Ok(Generation {
        text,
        tokens,
        stop,
        n_prompt: prompt.len(),
        prefill_secs,
        decode_secs: t1.elapsed().as_secs_f64(),
    })
}

/// One message of a chat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// "system", "user" or "assistant".
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message.
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage { role: role.to_string(), content: content.to_string() }
    }
}

/// The ChatML prompt of `messages` (`<|im_start|>{role}\n{content}<|im_end|>\n` each), with
/// the opening of the assistant's turn when `add_generation_prompt`. Encode it with
/// `parse_special` so the markers become their control tokens.
pub fn chatml(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut s = String::new();
    for m in messages {
        s.push_str(&format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content));
    }
    if add_generation_prompt {
        s.push_str("<|im_start|>assistant\n");
    }
    s
}

/// The system prompt a ChatML chat template (`tokenizer.chat_template`) puts first when the chat
/// has none (as SmolLM2's and Qwen 2's templates do), or `None` when the template is not
/// ChatML or has no such literal text.
pub fn chatml_default_system(template: &str) -> Option<String> {
    let start = "<|im_start|>system\n";
    let i = template.find(start)? + start.len();
    let rest = &template[i..];
    let end = rest.find("<|im_end|>")?;
    let sys = &rest[..end];
    (!sys.is_empty() && !sys.contains(['{', '}', '\'', '"'])).then(|| sys.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_formats_turns() {
        let m = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi")];
        assert_eq!(
            chatml(&m, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let t = "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}";
        assert_eq!(
            chatml_default_system(t).as_deref(),
            Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face")
        );
        assert_eq!(chatml_default_system("{{ bos_token }}"), None);
    }
}
