"""`sangama generate` and the demo: stages of one model chained in this process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.errors import TokenizerError
from core.model_inputs import model_file, stage_ranges, suggest_cuts
from core.models import stage_files
from core.pipeline import LocalPipeline, PipelineGeneration, compare_generations
from core.stage import Stage
from core.tokenizer import Tokenizer
from core.types import LayerRange, SamplingParams, StageSpec


def even_cuts(n_layer: int, n_stages: int = 3) -> list[int]:
    return [round(i * n_layer / n_stages) for i in range(n_stages + 1)]


def _context_size(n_prompt: int, max_tokens: int) -> int:
    need = n_prompt + max_tokens + 1
    return max(512, -(-need // 256) * 256)


def build_pipeline(
    paths: list[Path],
    ranges: list[LayerRange],
    n_layer: int,
    n_ctx: int,
    n_batch: int,
    threads: int,
    c_callback: bool,
    use_gpu: bool = True,
) -> LocalPipeline:
    stages: list[Stage] = []
    try:
        for path, layers in zip(paths, ranges, strict=True):
            spec = StageSpec(
                layers,
                n_layer,
                n_ctx=n_ctx,
                n_batch=n_batch,
                n_seq_max=1,
                n_threads=threads,
                use_gpu=use_gpu,
            )
            stages.append(Stage.from_file(path, spec, c_callback=c_callback))
    except BaseException:
        for s in stages:
            s.shutdown()
        raise
    return LocalPipeline(stages)


def run_generate(
    *,
    model: str,
    cuts: list[int] | None,
    prompt: str,
    chat: bool,
    max_tokens: int,
    sampling: SamplingParams,
    compare: bool,
    threads: int,
    chunk: int,
    stop_at_end: bool,
    c_callback: bool,
    stream: Callable[[str], None] | None,
    prompt_tokens: list[int] | None = None,
) -> dict[str, Any]:
    # The model and the cuts are checked before llama.cpp loads anything: a misuse is
    # refused in one sentence (core.model_inputs), not half-way through loading.
    model_path = model_file(model)
    manifest, _ = stage_files(model_path, [])
    n_layer = manifest.facts.n_layer
    ranges = stage_ranges(manifest.facts, cuts or suggest_cuts(manifest.facts))
    tokenizer = Tokenizer.from_gguf(model_path)
    try:
        if prompt_tokens is None:
            prompt_tokens = (
                tokenizer.encode_chat([("user", prompt)]) if chat else tokenizer.encode(prompt)
            )
        elif max(prompt_tokens) >= tokenizer.n_vocab:
            raise TokenizerError(
                f"token id {max(prompt_tokens)} is outside the vocabulary "
                f"(0..{tokenizer.n_vocab - 1})"
            )
        streamer = tokenizer.streamer()

        def on_token(tok: int) -> None:
            if stream is not None and not tokenizer.is_end(tok):
                stream(streamer.push(tok))

        is_end = tokenizer.is_end if stop_at_end else (lambda _t: False)
        n_ctx = _context_size(len(prompt_tokens), max_tokens)
        _, paths = stage_files(model_path, ranges)

        chain = build_pipeline(paths, ranges, n_layer, n_ctx, chunk, threads, c_callback)
        try:
            gen = chain.generate(
                prompt_tokens,
                max_tokens,
                sampling,
                chunk=chunk,
                is_end=is_end,
                keep_logits=compare,
                on_token=on_token,
            )
        finally:
            chain.shutdown()
        if stream is not None:
            stream(streamer.flush())
        report = _report(model_path, ranges, gen, tokenizer)
        if compare:
            whole = build_pipeline(
                [model_path], [LayerRange(0, n_layer)], n_layer, n_ctx, chunk, threads, c_callback
            )
            try:
                ref = whole.generate(
                    prompt_tokens,
                    max_tokens,
                    sampling,
                    chunk=chunk,
                    is_end=is_end,
                    keep_logits=True,
                )
            finally:
                whole.shutdown()
            cmp = compare_generations(gen, ref)
            report.update(
                identical=cmp.identical,
                first_difference=cmp.first_difference,
                max_abs_logit_diff=cmp.max_abs_logit_diff,
                whole_tokens=list(ref.tokens),
                whole_decode_tokens_per_s=ref.decode_tokens_per_s,
            )
        return report
    finally:
        tokenizer.close()


def _report(
    model_path: Path, ranges: list[LayerRange], gen: PipelineGeneration, tok: Tokenizer
) -> dict[str, Any]:
    steps = max(len(gen.tokens), 1)
    return {
        "model": str(model_path),
        "ranges": [str(r) for r in ranges],
        "n_prompt_tokens": len(gen.prompt_tokens),
        "n_tokens": len(gen.tokens),
        "tokens": list(gen.tokens),
        "text": tok.decode([t for t in gen.tokens if not tok.is_end(t)]),
        "stopped_by_end_token": gen.stopped_by_end_token,
        "prefill_ms": gen.prefill_s * 1e3,
        "decode_tokens_per_s": gen.decode_tokens_per_s,
        "stage_ms_per_token": [s * 1e3 / steps for s in gen.stage_s],
    }
