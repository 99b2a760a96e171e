//! Prints a GGUF file's metadata and tensor table.
//!
//! ```text
//! cargo run --release --example gguf_inspect -- model.gguf
//! ```

use quantgraph::gguf::GgufFile;

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: gguf_inspect FILE.gguf");
        std::process::exit(2);
    };
    let file = match GgufFile::open(&path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    println!(
        "{path}: GGUF v{}, {} bytes, alignment {}, data at offset {}",
        file.version(),
        file.buffer().len(),
        file.alignment(),
        file.gguf().data_offset()
    );

    let meta = file.metadata();
    println!("\nmetadata ({} keys):", meta.len());
    let kw = meta.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in meta.iter() {
        let mut shown = value.to_string();
        if shown.chars().count() > 120 {
            shown = shown.chars().take(117).collect::<String>() + "...";
        }
        println!("  {key:<kw$}  {:<9} {shown}", value.type_name());
    }

    let tensors = file.tensors();
    println!("\ntensors ({}):", tensors.len());
    let nw = tensors.iter().map(|t| t.name().len()).max().unwrap_or(4).max(4);
    println!("  {:<nw$}  {:<8} {:<24} {:>14} {:>14}", "name", "type", "shape", "bytes", "offset");
    let mut total = 0u64;
    for t in tensors {
        let shape =
            format!("[{}]", t.shape().iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "));
        println!(
            "  {:<nw$}  {:<8} {:<24} {:>14} {:>14}",
            t.name(),
            t.dtype().name(),
            shape,
            t.size(),
            t.offset()
        );
        total += t.size() as u64;
    }
    println!("\n{} tensors, {total} bytes of tensor data", tensors.len());
}
