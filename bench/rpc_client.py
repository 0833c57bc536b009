"""The llama.cpp RPC client for bench/rpc_compare.py: the engine wheel's llama.cpp with ggml's
RPC backend module loaded, the model split over the given rpc-servers, greedy decoding.

Run as a child process (the RPC devices it registers stay in its own backend registry);
prints one JSON object: decode tokens/s and the tokens.

    .venv/bin/python bench/rpc_client.py --module libggml-rpc.so --rpc h:p,h:p,h:p \
        --model m.gguf [--tokens 32] [--threads 1] [--repack 0]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llama_cpp.llama_cpp as _ll
import numpy as np

from core.backends import ensure_backends, lib_path

LL: Any = _ll


def rpc_devices(module: Path, endpoints: list[str]) -> list[int]:
    """Load the RPC module into this llama.cpp and register one device per server."""
    ggml = ctypes.CDLL(str(lib_path("ggml")))
    base = ctypes.CDLL(str(lib_path("ggml-base")))
    ggml.ggml_backend_load.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_load.restype = ctypes.c_void_p
    ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
    base.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    base.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    base.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    base.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    base.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    base.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    reg = ggml.ggml_backend_load(str(module).encode())
    if not reg:
        raise SystemExit(f"could not load {module} into this llama.cpp")
    fn = base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not fn:
        raise SystemExit("the RPC module has no ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(fn)
    devices = []
    for endpoint in endpoints:
        server = add_server(endpoint.encode())
        if not server or base.ggml_backend_reg_dev_count(server) < 1:
            raise SystemExit(f"rpc-server {endpoint} did not answer")
        ggml.ggml_backend_register(server)
        devices.append(int(base.ggml_backend_reg_dev_get(server, 0)))
    return devices


def run(args: argparse.Namespace) -> dict[str, Any]:
    ensure_backends()
    LL.llama_backend_init()
    devices = rpc_devices(Path(args.module), args.rpc.split(","))
    mp = LL.llama_model_default_params()
    dev_array = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
    mp.devices = ctypes.cast(dev_array, ctypes.c_void_p)
    mp.n_gpu_layers = 999  # every block and the head on the servers, split by layer
    split = (ctypes.c_float * len(devices))(*([1.0] * len(devices)))
    mp.tensor_split = split
    mp.use_extra_bufts = bool(args.repack)
    model = LL.llama_model_load_from_file(args.model.encode(), mp)
    if not model:
        raise SystemExit("llama.cpp could not load the model over RPC")
    cp = LL.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 64, 64
    cp.n_threads = cp.n_threads_batch = args.threads
    cp.no_perf = True
    ctx = LL.llama_init_from_model(model, cp)
    vocab = LL.llama_model_get_vocab(model)
    n_vocab = int(LL.llama_vocab_n_tokens(vocab))
    text = args.prompt.encode()
    buf = (LL.llama_token * (len(text) + 16))()
    n = int(LL.llama_tokenize(vocab, text, len(text), buf, len(buf), True, True))
    prompt = list(buf[:n])

    def step(tokens: list[int]) -> int:
        arr = (LL.llama_token * len(tokens))(*tokens)
        if int(LL.llama_decode(ctx, LL.llama_batch_get_one(arr, len(tokens)))) != 0:
            raise SystemExit("llama_decode failed")
        row = np.ctypeslib.as_array(LL.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        return int(np.argmax(row))

    watched = [int(p) for p in args.watch_pids.split(",") if p]
    best, tokens, cpu = 0.0, [], {}
    for _ in range(2):  # the first run warms caches and the servers' graphs
        LL.llama_memory_clear(LL.llama_get_memory(ctx), True)
        tok = step(prompt)
        tokens = [tok]
        c0, s0 = time.process_time(), [cpu_ms(p) for p in watched]
        t0 = time.perf_counter()
        for _ in range(args.tokens):
            tok = step([tok])
            tokens.append(tok)
        tps = args.tokens / (time.perf_counter() - t0)
        if tps > best:
            best = tps
            cpu = {
                "client": (time.process_time() - c0) * 1e3 / args.tokens,
                "servers": [
                    (cpu_ms(p) - s) / args.tokens for p, s in zip(watched, s0, strict=True)
                ],
            }
    LL.llama_free(ctx)
    LL.llama_model_free(model)
    return {"tokens_per_s": best, "tokens": tokens, "cpu_ms_per_token": cpu}


def cpu_ms(pid: int) -> float:
    """CPU time (user + system) a process has used so far, in ms (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1e3 / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", required=True)
    ap.add_argument("--rpc", required=True, help="host:port of every server, comma separated")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", default="Write a short story about a lighthouse keeper.")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repack", type=int, choices=[0, 1], default=0)
    ap.add_argument("--watch-pids", default="", help="servers whose CPU time per token to report")
    print(json.dumps(run(ap.parse_args())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
