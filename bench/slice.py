"""Slicing benchmark: how fast `sangama slice` cuts a big GGUF, and in how much memory.

Writes a GGUF fixture of about --size-gb (a llama-architecture model: Q4_0 attention and
FFN matrices, F16 embedding and output, a 32 000-token tokenizer; random bytes as weights,
written in chunks, never held in memory), then slices it in a child process and reports
the rate (source GB read per second), the child's peak resident memory (VmHWM) and what
it was before slicing began (imports alone), and what the rate means for a 220 GB model.
Optionally the same model as a gguf-split shard set (--shards N). Not a test: figures
depend on the disk and the machine.

    .venv/bin/python bench/slice.py [--size-gb 6] [--dir /tmp] [--shards 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

GOAL_RSS_BYTES = 1 << 30
"""Peak RSS the slicer must stay under for the 6 GB model."""
EXTRAPOLATE_TO_BYTES = 220e9
_Q4_0 = GGMLQuantizationType.Q4_0
_F16 = GGMLQuantizationType.F16
_F32 = GGMLQuantizationType.F32
_NOISE = 16 << 20  # random bytes repeated as tensor data: writing stays disk-bound


def _q4_0_bytes(rows: int, cols: int) -> int:
    return rows * cols // 32 * 18


def fixture_tensors(
    n_layer: int, n_embd: int, n_ff: int, n_vocab: int
) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType, int]]:
    """(name, numpy-order shape, type, bytes) of every tensor, in file order."""
    out: list[tuple[str, tuple[int, ...], GGMLQuantizationType, int]] = [
        ("token_embd.weight", (n_vocab, n_embd), _F16, n_vocab * n_embd * 2)
    ]
    for i in range(n_layer):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", (n_embd,), _F32, n_embd * 4))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            out.append((p + name + ".weight", (n_embd, n_embd), _Q4_0, _q4_0_bytes(n_embd, n_embd)))
        out.append((p + "ffn_norm.weight", (n_embd,), _F32, n_embd * 4))
        out.append((p + "ffn_gate.weight", (n_ff, n_embd), _Q4_0, _q4_0_bytes(n_ff, n_embd)))
        out.append((p + "ffn_up.weight", (n_ff, n_embd), _Q4_0, _q4_0_bytes(n_ff, n_embd)))
        out.append((p + "ffn_down.weight", (n_embd, n_ff), _Q4_0, _q4_0_bytes(n_embd, n_ff)))
    out.append(("output_norm.weight", (n_embd,), _F32, n_embd * 4))
    out.append(("output.weight", (n_vocab, n_embd), _F16, n_vocab * n_embd * 2))
    return out


def layers_for(
    size_bytes: float, n_embd: int = 4096, n_ff: int = 11008, n_vocab: int = 32000
) -> int:
    """Blocks that bring the fixture to about `size_bytes`."""
    fixed = sum(t[3] for t in fixture_tensors(0, n_embd, n_ff, n_vocab))
    per_block = sum(t[3] for t in fixture_tensors(1, n_embd, n_ff, n_vocab)) - fixed
    return max(1, round((size_bytes - fixed) / per_block))


def write_fixture(
    path: Path, n_layer: int, n_embd: int = 4096, n_ff: int = 11008, n_vocab: int = 32000
) -> int:
    """Write the fixture GGUF to `path` in chunks; returns its size in bytes."""
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, _NOISE, dtype=np.uint8).tobytes()
    w = GGUFWriter(str(path), arch="llama")
    w.add_name("slice-bench")
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(32)
    w.add_head_count_kv(32)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<tok{i}>" for i in range(n_vocab)])
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types([1] * n_vocab)
    tensors = fixture_tensors(n_layer, n_embd, n_ff, n_vocab)
    for name, shape, dtype, nbytes in tensors:
        # Shapes as numpy gives them: elements, or bytes per row for Q4_0 (gguf-py's rule).
        byte_shape = shape if dtype != _Q4_0 else (*shape[:-1], shape[-1] // 32 * 18)
        np_dtype = np.uint8 if dtype == _Q4_0 else np.float16 if dtype == _F16 else np.float32
        w.add_tensor_info(name, byte_shape, np.dtype(np_dtype), nbytes, raw_dtype=dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    f = w.fout[0]
    w.write_padding(f, f.tell())
    at = 0
    for _, _, _, nbytes in tensors:
        left = nbytes
        while left:
            n = min(left, _NOISE - at)
            f.write(noise[at : at + n])
            at = (at + n) % _NOISE
            left -= n
        w.write_padding(f, nbytes)
    w.close()
    return path.stat().st_size


_CHILD = """
import json, resource, sys, time
from pathlib import Path
from core.gguf_slices import slice_model

def hwm():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

before = hwm()
t0 = time.perf_counter()
m = slice_model(Path(sys.argv[1]), Path(sys.argv[2]))
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "peak_rss_bytes": hwm(), "rss_before_bytes": before,
                  "pieces": len(m.pieces), "source_size": m.source_size}))
"""


def measure_child(model: Path, out_dir: Path) -> dict[str, Any]:
    """Slice `model` into `out_dir` in a fresh Python process; its seconds and memory."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(model), str(out_dir)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=root,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def figures(child: dict[str, Any]) -> dict[str, Any]:
    """Rates and the 220 GB extrapolation from one measured run."""
    size, seconds = int(child["source_size"]), float(child["seconds"])
    rate = size / seconds
    return {
        **child,
        "size_gb": size / 1e9,
        "gb_per_s": rate / 1e9,
        "peak_rss_mb": child["peak_rss_bytes"] / 2**20,
        "rss_before_mb": child["rss_before_bytes"] / 2**20,
        "rss_growth_mb": (child["peak_rss_bytes"] - child["rss_before_bytes"]) / 2**20,
        "peak_rss_vs_size": child["peak_rss_bytes"] / size,
        "under_goal": child["peak_rss_bytes"] < GOAL_RSS_BYTES,
        "extrapolated_220gb_minutes": EXTRAPOLATE_TO_BYTES / rate / 60,
    }


def _split(model: Path, n: int, out: Path) -> Path:
    """The fixture as an n-shard gguf-split set (tests/support's splitter); its first shard."""
    from gguf import GGUFReader

    from tests.support.gguf_fixtures import split_gguf

    per = -(-len(GGUFReader(str(model)).tensors) // n)
    return split_gguf(model, out, "bench", per)[0]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size-gb", type=float, default=6.0, help="fixture size (default 6)")
    ap.add_argument("--dir", type=Path, default=None, help="work folder (needs 2x the size)")
    ap.add_argument("--shards", type=int, default=0, help="also slice it as N gguf-split shards")
    ap.add_argument("--keep", action="store_true", help="keep the fixture and pieces")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="slice-bench-", dir=args.dir))
    try:
        model = work / "bench.gguf"
        t0 = time.perf_counter()
        size = write_fixture(model, layers_for(args.size_gb * 1e9))
        write_s = time.perf_counter() - t0
        runs = {"single_file": figures(measure_child(model, work / "pieces"))}
        if args.shards > 1:
            shard_dir = work / "shards"
            shard_dir.mkdir()
            first = _split(model, args.shards, shard_dir)
            model.unlink()  # room on the disk: the shards are the model now
            shutil.rmtree(work / "pieces")
            runs[f"{args.shards}_shards"] = figures(measure_child(first, work / "pieces-shards"))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    report = {
        "fixture_bytes": size,
        "fixture_write_s": write_s,
        "runs": runs,
        "load": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"fixture {size / 1e9:.2f} GB written in {write_s:.1f} s; load {report['load']:.2f}")
    print(
        f"{'run':<14} {'GB/s':>6} {'s':>7} {'peak RSS MB':>12} {'before MB':>10} "
        f"{'220 GB min':>11} {'< 1 GB':>7}"
    )
    for name, r in runs.items():
        print(
            f"{name:<14} {r['gb_per_s']:>6.2f} {r['seconds']:>7.1f} {r['peak_rss_mb']:>12.0f} "
            f"{r['rss_before_mb']:>10.0f} {r['extrapolated_220gb_minutes']:>11.1f} "
            f"{'yes' if r['under_goal'] else 'NO':>7}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
