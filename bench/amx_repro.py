"""Minimal reproduction of the AMX crash with llama-cpp-python alone (no Sangama code).

Loads a GGUF with llama.cpp's default model parameters, so weights the AMX buffer type
accepts are packed for AMX, then evaluates a short prompt and a few tokens. Each case runs
in a child process so a segmentation fault is reported instead of ending the run:

- default (AMX and repacked layouts allowed: crashes on affected Xeons),
- use_extra_bufts = False (no AMX, no repacking: runs, slower everywhere).

Needs an engine built with the AMX variant, i.e. a native build on an AMX CPU
(`make engine-native`, then `.venv-native/bin/python bench/amx_repro.py`); the shipped
wheel has no AMX code, so there both cases run. `grep -c amx_tile /proc/cpuinfo` says
whether the CPU has AMX at all.

    python bench/amx_repro.py [--model PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys

CHILD = r"""
import ctypes, pathlib, sys
import llama_cpp as L
path, extra = sys.argv[1], sys.argv[2] == "1"
lib = pathlib.Path(L.__file__).parent / "lib"
# The SONAME copy (libggml.so.0): libllama maps that file; opening the unversioned copy
# would give a second, empty backend registry (see core/backends.lib_path).
so = sorted(lib.glob("libggml.so.*"), key=lambda p: len(p.name)) or [lib / "libggml.so"]
ggml = ctypes.CDLL(str(so[0]))
ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
if ggml.ggml_backend_dev_count() == 0:  # a GGML_BACKEND_DL build registers nothing by itself
    ggml.ggml_backend_load_all_from_path(str(lib).encode())
L.llama_backend_init()
params = L.llama_model_default_params()
params.use_extra_bufts = extra
model = L.llama_model_load_from_file(path.encode(), params)
assert model, "load failed"
ctx = L.llama_init_from_model(model, L.llama_context_default_params())
vocab = L.llama_model_get_vocab(model)
toks = (L.llama_token * 64)()
n = L.llama_tokenize(vocab, b"The capital of France is", 24, toks, 64, True, False)
assert L.llama_decode(ctx, L.llama_batch_get_one(toks, n)) == 0  # prompt: many rows
nv = L.llama_vocab_n_tokens(vocab)
for _ in range(4):  # decode: one row per matmul
    logits = L.llama_get_logits_ith(ctx, -1)
    best = max(range(nv), key=lambda i: logits[i])
    one = (L.llama_token * 1)(best)
    assert L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) == 0
print("OK")
"""


def run_case(model: str, extra_bufts: bool) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, model, "1" if extra_bufts else "0"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    crashed = proc.returncode < 0
    buffers = [ln.strip() for ln in proc.stderr.splitlines() if "model buffer size" in ln]
    return {
        "use_extra_bufts": extra_bufts,
        "returncode": proc.returncode,
        "signal": signal.Signals(-proc.returncode).name if crashed else None,
        "ok": proc.returncode == 0 and "OK" in proc.stdout,
        "weight_buffers": buffers,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the Gemma 3 270M package)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = args.model
    if model is None:
        sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
        from core.models import resolve_model

        model = str(resolve_model("gemma-3-270m"))
    cases = [run_case(model, True), run_case(model, False)]
    if args.json:
        print(json.dumps(cases, indent=1))
    else:
        for c in cases:
            state = "ok" if c["ok"] else f"FAILED ({c['signal'] or c['returncode']})"
            print(f"use_extra_bufts={c['use_extra_bufts']!s:5}  {state}")
            for line in c["weight_buffers"]:  # type: ignore[attr-defined]
                print(f"    {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
