//! The dispatch rules, checked on the source: op drivers (`src/ops`) read kernels only through
//! their node context (`ctx.kt`, the plan's table), never through the process-wide default, and
//! hold no CPU-specific code or feature checks (those live in `src/kernels`, behind the table).

use std::path::Path;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn op_drivers_read_kernels_only_through_the_node_context() {
    let mut files = Vec::new();
    rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/ops"), &mut files);
    assert!(files.len() > 10, "src/ops not found: {files:?}");
    let banned = [
        "kernels::table()",
        "kernels::table_for",
        "selected_isa",
        "kernels::x86",
        "std::arch",
        "is_x86_feature_detected",
        "target_feature",
    ];
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (i, line) in text.lines().enumerate() {
            for b in banned {
                if line.contains(b) {
                    found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "op drivers bypass the plan's kernel table:\n{}", found.join("\n"));
}
