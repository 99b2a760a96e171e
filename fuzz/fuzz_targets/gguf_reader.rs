//! Fuzzes the GGUF reader: any bytes must give `Ok` or `Err`, never a panic, and whatever is
//! accepted must describe tensors that lie inside the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quantgraph::gguf::{Gguf, GgufFile};

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = Gguf::parse(data) {
        for t in g.tensors() {
            assert!(t.offset() + t.size() <= data.len());
            assert_eq!(t.offset() % g.alignment(), 0);
        }
        let file = GgufFile::from_bytes(data).expect("parsed once, parses again");
        for t in file.tensors() {
            let _ = file.tensor_data(t.name()).expect("tensor data is readable");
        }
    }
});
