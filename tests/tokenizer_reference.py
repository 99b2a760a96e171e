#!/usr/bin/env python3
"""Writes tests/data/tokenizer/<name>.json: the ids llama.cpp's `llama-tokenize` gives for every
entry of tests/data/tokenizer/corpus.json, with and without special-token parsing.

usage: tokenizer_reference.py LLAMA_TOKENIZE NAME MODEL.gguf
"""
import json, os, subprocess, sys, tempfile

tool, name, model = sys.argv[1:4]
here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tokenizer")
corpus = json.load(open(os.path.join(here, "corpus.json"), encoding="utf-8"))
out = {"vocab": name, "parse_special": [], "no_parse_special": []}
for text in corpus:
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write(text.encode("utf-8"))
    for key, extra in (("parse_special", []), ("no_parse_special", ["--no-parse-special"])):
        r = subprocess.run([tool, "-m", model, "-f", f.name, "--ids", "--log-disable"] + extra,
                           capture_output=True, check=True)
        line = r.stdout.decode().strip().splitlines()[-1]
        out[key].append(json.loads(line))
    os.unlink(f.name)
with open(os.path.join(here, name + ".json"), "w") as f:
    json.dump(out, f, separators=(",", ":"))
    f.write("\n")
