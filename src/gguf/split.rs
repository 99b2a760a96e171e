//! Models split over several GGUF files, as llama.cpp's `llama-gguf-split` writes them: shard `i`
//! of `n` is `{prefix}-{i+1:05}-of-{n:05}.gguf` and holds the keys `split.no`, `split.count` and
//! `split.tensors.count`; the first shard also holds the model's metadata. [`GgufModel::open`]
//! opens the first shard (or an unsplit file), maps every shard and finds each tensor in its
//! shard, zero-copy; [`GgufWriter::write_split`](super::GgufWriter::write_split) writes shards.

use super::{GgufFile, TensorInfo, value::Metadata};
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::graph::{Graph, TensorId};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The shard number key (u16, from 0).
pub const KEY_SPLIT_NO: &str = "split.no";
/// The shard count key (u16).
pub const KEY_SPLIT_COUNT: &str = "split.count";
/// The key holding the number of tensors of all shards together (i32).
pub const KEY_SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// When [`GgufWriter::write_split`](super::GgufWriter::write_split) starts a new shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SplitBy {
    /// At most this many tensors per shard (`--split-max-tensors`).
    MaxTensors(usize),
    /// At most this many bytes of tensor data per shard, each tensor counted padded to 32
    /// bytes (`--split-max-size`); a tensor larger than the limit gets a shard of its own.
    MaxBytes(usize),
}

/// llama.cpp's `llama_split_path`: the path of shard `i` (from 0) of `n`,
/// `{prefix}-{i+1:05}-of-{n:05}.gguf`.
///
/// ```
/// assert_eq!(quantgraph::gguf::split_path("out/model", 0, 3), "out/model-00001-of-00003.gguf");
/// ```
pub fn split_path(prefix: &str, i: usize, n: usize) -> String {
    format!("{prefix}-{:05}-of-{n:05}.gguf", i + 1)
}

/// llama.cpp's `llama_split_prefix`: the prefix of a shard path made by [`split_path`], `None`
/// when `path` does not end with that shard's suffix.
pub fn split_prefix(path: &str, i: usize, n: usize) -> Option<&str> {
    path.strip_suffix(&format!("-{:05}-of-{n:05}.gguf", i + 1))
}

/// One model from a GGUF file or from every shard of a split model, each memory-mapped: the
/// metadata (of the first shard, without the `split.*` keys' meaning lost: they stay readable)
/// and every tensor, bound zero-copy from its own shard's buffer.
#[derive(Clone, Debug)]
pub struct GgufModel {
    shards: Vec<GgufFile>,
    /// Per tensor: (shard, index in that shard's tensor list).
    by_name: HashMap<String, (usize, usize)>,
    /// Names in shard order, then file order.
    order: Vec<(usize, usize)>,
}

fn split_key(md: &Metadata, key: &str, path: &Path) -> Result<Option<u64>> {
    let v = match md.get(key) {
        None => return Ok(None),
        Some(v) => v,
    };
    let n = match *v {
        super::Value::U16(x) => x as u64,
        super::Value::U32(x) => x as u64,
        super::Value::I32(x) if x >= 0 => x as u64,
        super::Value::U64(x) => x,
        _ => {
            return Err(Error::Gguf(format!(
                "{}: '{key}' has type {} and value {v}, not a count",
                path.display(),
                v.type_name()
            )));
        }
    };
    Ok(Some(n))
}

impl GgufModel {
    /// Opens a model: an unsplit file, or the first shard of a split model (`split.no` 0), in
    /// which case every other shard is opened from the paths [`split_path`] gives, and each is
    /// checked (`split.no`, `split.count`, total `split.tensors.count`, no tensor twice).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufModel> {
        let path = path.as_ref();
        let first = GgufFile::open(path)?;
        let md = first.metadata();
        let count = split_key(md, KEY_SPLIT_COUNT, path)?.unwrap_or(1);
        let no = split_key(md, KEY_SPLIT_NO, path)?.unwrap_or(0);
        if count == 0 || no != 0 {
            return Err(Error::Gguf(format!(
                "{}: {KEY_SPLIT_NO} = {no}, {KEY_SPLIT_COUNT} = {count}: open the first shard of a split model",
                path.display()
            )));
        }
        let count = count as usize;
        let mut shards = vec![first];
        if count > 1 {
            let p = path
                .to_str()
                .ok_or_else(|| Error::Gguf(format!("{}: the path is not UTF-8", path.display())))?;
            let prefix = split_prefix(p, 0, count).ok_or_else(|| {
                Error::Gguf(format!(
                    "{}: a first shard of {count} must be named {}",
                    path.display(),
                    split_path("<prefix>", 0, count)
                ))
            })?;
            for i in 1..count {
                let sp = PathBuf::from(split_path(prefix, i, count));
                let f = GgufFile::open(&sp)?;
                let no = split_key(f.metadata(), KEY_SPLIT_NO, &sp)?;
                let n = split_key(f.metadata(), KEY_SPLIT_COUNT, &sp)?;
                if no != Some(i as u64) || n != Some(count as u64) {
                    return Err(Error::Gguf(format!(
                        "{}: {KEY_SPLIT_NO} = {no:?}, {KEY_SPLIT_COUNT} = {n:?}, expected {i} and {count}",
                        sp.display()
                    )));
                }
                shards.push(f);
            }
        }
        GgufModel::from_shards(shards, path)
    }

    /// A model from files already opened (or read with [`GgufFile::from_reader`]): one unsplit
    /// file, or every shard in order.
    pub fn from_files(shards: Vec<GgufFile>) -> Result<GgufModel> {
        GgufModel::from_shards(shards, Path::new("<shards>"))
    }

    fn from_shards(shards: Vec<GgufFile>, path: &Path) -> Result<GgufModel> {
        if shards.is_empty() {
            return Err(Error::Gguf("a model needs at least one file".into()));
        }
        let mut by_name = HashMap::new();
        let mut order = Vec::new();
        for (s, f) in shards.iter().enumerate() {
            for (i, t) in f.tensors().iter().enumerate() {
                if by_name.insert(t.name().to_string(), (s, i)).is_some() {
                    return Err(Error::Gguf(format!(
                        "{}: tensor '{}' is in more than one shard",
                        path.display(),
                        t.name()
                    )));
                }
                order.push((s, i));
            }
        }
        if shards.len() > 1 || shards[0].metadata().contains_key(KEY_SPLIT_TENSORS_COUNT) {
            let want = split_key(shards[0].metadata(), KEY_SPLIT_TENSORS_COUNT, path)?;
            if want.is_some_and(|w| w != order.len() as u64) {
                return Err(Error::Gguf(format!(
                    "{}: {KEY_SPLIT_TENSORS_COUNT} = {} but the shards hold {} tensors",
                    path.display(),
                    want.unwrap_or(0),
                    order.len()
                )));
            }
        }
        Ok(GgufModel { shards, by_name, order })
    }

    /// The model's metadata (the first shard's).
    pub fn metadata(&self) -> &Metadata {
        self.shards[0].metadata()
    }

    /// The shards (one file for an unsplit model).
    pub fn shards(&self) -> &[GgufFile] {
        &self.shards
    }

    /// Every tensor: shard by shard, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        self.order.iter().map(|&(s, i)| &self.shards[s].tensors()[i])
    }

    /// Number of tensors in all shards.
    pub fn n_tensors(&self) -> usize {
        self.order.len()
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&(s, i)| &self.shards[s].tensors()[i])
    }

    /// The shard holding tensor `name` and the tensor's info there; its bytes are at
    /// `info.offset()` of that shard's [`GgufFile::buffer`].
    pub fn locate(&self, name: &str) -> Option<(&GgufFile, &TensorInfo)> {
        self.by_name.get(name).map(|&(s, i)| (&self.shards[s], &self.shards[s].tensors()[i]))
    }

    /// The buffer (mapped shard) holding tensor `name`.
    pub fn buffer_of(&self, name: &str) -> Option<&Buffer> {
        self.locate(name).map(|(f, _)| f.buffer())
    }

    /// A copy of the bytes of tensor `name`.
    pub fn tensor_data(&self, name: &str) -> Result<Vec<u8>> {
        let (f, _) =
            self.locate(name).ok_or_else(|| Error::Gguf(format!("no tensor named '{name}'")))?;
        f.tensor_data(name)
    }

    /// Adds tensor `name` to `graph` as a weight reading its shard's buffer in place.
    pub fn bind(&self, graph: &mut Graph, name: &str) -> Result<TensorId> {
        let (f, _) =
            self.locate(name).ok_or_else(|| Error::Gguf(format!("no tensor named '{name}'")))?;
        f.bind(graph, name)
    }
}
