//! The crate's layers depend one way (ARCHITECTURE.md, "Layers"): a file may name items of its
//! own layer and of the layers listed before it, never of a later one. Reads `src/` as text.
//! Comments, unit-test modules and public re-exports (`pub use`, which keep public paths stable)
//! are not dependencies.

use std::path::{Path, PathBuf};

/// Top-level modules of `src/`, from the bottom layer up; modules sharing an entry are one layer.
const LAYERS: &[&[&str]] = &[
    &["error", "dtype"],
    &["quant"],
    &["testdata"],
    &["kernels"],
    &["buffer"],
    &["graph"],
    &["ops"],
    &["backend"],
    &["plan"],
    &["sched"],
    &["gguf"],
    &["tokenizer"],
    &["models"],
    &["opt"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let p = entry.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file that counts as dependencies: without comments, without the unit-test
/// module at its end, without `pub use` re-exports.
fn code(text: &str) -> String {
    let body = ["#[cfg(test)]\nmod tests", "#[cfg(test)]\npub(crate) mod tests"]
        .iter()
        .filter_map(|m| text.find(m))
        .min()
        .map_or(text, |i| &text[..i]);
    let mut out = String::new();
    let mut in_pub_use = false;
    for line in body.lines() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        if t.starts_with("pub use") || t.starts_with("pub(crate) use") {
            in_pub_use = !t.ends_with(';');
            continue;
        }
        if in_pub_use {
            in_pub_use = !t.ends_with(';');
            continue;
        }
        out.push_str(line.split(" // ").next().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// Every `crate::module` a piece of code names, including inside `use crate::{a::.., b::..}`.
fn named_modules(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let m: String =
                    part.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                names.push(m);
            }
        } else {
            names.push(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    names
}

#[test]
fn no_file_depends_on_a_later_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut upward = Vec::new();
    let mut checked = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src");
        let first = rel.components().next().expect("component").as_os_str().to_string_lossy();
        let module = first.trim_end_matches(".rs");
        let Some(own) = layer_of(module) else {
            assert!(module == "lib", "{} is in no layer: add its module to LAYERS", rel.display());
            continue;
        };
        // A unit-test module in a file of its own (`#[cfg(test)] mod tests;`) is test code
        // throughout.
        if f.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        checked += 1;
        let text = std::fs::read_to_string(f).expect("read file");
        for m in named_modules(&code(&text)) {
            if let Some(l) = layer_of(&m)
                && l > own
            {
                upward.push(format!("{} -> crate::{m}", rel.display()));
            }
        }
    }
    upward.sort();
    upward.dedup();
    assert!(checked > 50, "only {checked} files read");
    assert!(upward.is_empty(), "imports from a later layer:\n{}", upward.join("\n"));
}

#[test]
fn the_checker_sees_grouped_and_plain_paths() {
    let c = code(
        "use crate::{dtype::DType, plan::Plan};\n// crate::models::x\nfn f() { crate::ops::g(); }\npub use crate::gguf::X;\n",
    );
    assert_eq!(named_modules(&c), ["dtype", "plan", "ops"]);
    let c = code(
        "fn f() { crate::dtype::x(); }\n#[cfg(test)]\npub(crate) mod tests {\n    use crate::models::y;\n}\n",
    );
    assert_eq!(named_modules(&c), ["dtype"]);
}
