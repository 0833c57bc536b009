"""The `sangama` command. Headless: imports no Qt, so servers and CI can run it."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.errors import CoreError
from core.types import LayerRange, SamplingParams

DEMO_QUESTION = "In two sentences, why do volunteers share computers to run one big model?"


def _parse_cuts(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"cuts must be integers like 0,6,12,18, not {text!r}"
        ) from None


def _add_sampling(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--repeat-penalty", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)


def _sampling(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repeat_penalty,
        seed=args.seed,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sangama", description="Run one large language model across many PCs."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("slice", help="cut a GGUF model into per-layer pieces and a manifest")
    p.add_argument("model", help="GGUF file, or 'default'")
    p.add_argument("--out", required=True, type=Path, help="output directory")

    p = sub.add_parser("assemble", help="build a stage GGUF for layers [start, stop) from pieces")
    p.add_argument("pieces", type=Path, help="directory holding manifest.json and the pieces")
    p.add_argument("--layers", required=True, help="START:STOP, e.g. 6:12")
    p.add_argument("--out", required=True, type=Path, help="stage GGUF to write")

    p = sub.add_parser("generate", help="chain stages in one process and generate")
    p.add_argument("--model", default="default", help="'default' or a GGUF path")
    p.add_argument(
        "--cuts", type=_parse_cuts, default=None, help="e.g. 0,6,12,18 (default: 3 even stages)"
    )
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument(
        "--chat", action="store_true", help="wrap the prompt in the model's chat template"
    )
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument(
        "--ignore-eos", action="store_true", help="do not stop at end-of-generation tokens"
    )
    p.add_argument("--compare", action="store_true", help="also run the whole model and compare")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chunk", type=int, default=64, help="prompt positions per step")
    p.add_argument(
        "--python-callback", action="store_true", help="capture hidden states in Python, not C"
    )
    _add_sampling(p)

    p = sub.add_parser("demo", help="answer one question on the default model, end to end")
    p.add_argument("--prompt", default=DEMO_QUESTION)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--model", default="default")

    sub.add_parser("hardware", help="show the memory this machine can offer")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handler = _COMMANDS[args.command]
    try:
        return handler(args)
    except CoreError as exc:
        print(f"sangama {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


# ---------------------------------------------------------------- commands


def cmd_slice(args: argparse.Namespace) -> int:
    from core.gguf_slices import slice_model
    from core.models import resolve_model

    model = resolve_model(args.model)
    manifest = slice_model(model, args.out)
    f = manifest.facts
    print(
        f"wrote {len(manifest.pieces)} pieces and manifest.json to {args.out} "
        f"({f.architecture}, {f.n_layer} layers, n_embd {f.n_embd}, vocab {f.n_vocab})"
    )
    return 0


def cmd_assemble(args: argparse.Namespace) -> int:
    from core.gguf_slices import assemble_stage
    from core.manifest import Manifest

    try:
        a, b = (int(x) for x in args.layers.split(":"))
        layers = LayerRange(a, b)
    except ValueError as exc:
        print(f"sangama assemble: error: --layers must be START:STOP ({exc})", file=sys.stderr)
        return 2
    out = assemble_stage(Manifest.load(args.pieces), args.pieces, layers, args.out)
    print(f"wrote stage {layers} to {out}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from app.local_run import run_generate

    report = run_generate(
        model=args.model,
        cuts=args.cuts,
        prompt=args.prompt,
        chat=args.chat,
        max_tokens=args.max_tokens,
        sampling=_sampling(args),
        compare=args.compare,
        threads=args.threads,
        chunk=args.chunk,
        stop_at_end=not args.ignore_eos,
        c_callback=not args.python_callback,
        stream=None if args.json else _stream_to_stdout,
    )
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print()
        _print_summary(report)
    return 0 if report.get("identical", True) else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from app.local_run import run_generate

    print(f"Q: {args.prompt}\nA: ", end="", flush=True)
    t0 = time.perf_counter()
    report = run_generate(
        model=args.model,
        cuts=None,
        prompt=args.prompt,
        chat=True,
        max_tokens=args.max_tokens,
        sampling=SamplingParams(),
        compare=False,
        threads=2,
        chunk=64,
        stop_at_end=True,
        c_callback=True,
        stream=_stream_to_stdout,
    )
    print("\n")
    _print_summary(report)
    print(f"total {time.perf_counter() - t0:.1f} s including model preparation")
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    from core.hardware import detect_hardware, format_report

    print(format_report(detect_hardware()))
    return 0


def _stream_to_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _print_summary(report: dict[str, Any]) -> None:
    stages = ", ".join(
        f"{r} {ms:.1f} ms"
        for r, ms in zip(report["ranges"], report["stage_ms_per_token"], strict=False)
    )
    print(
        f"{report['n_tokens']} tokens, {report['decode_tokens_per_s']:.1f} tok/s decode, "
        f"prefill {report['prefill_ms']:.0f} ms for {report['n_prompt_tokens']} prompt tokens; "
        f"{len(report['ranges'])} stages: {stages}"
    )
    if "identical" in report:
        print(
            f"whole model: {report['whole_decode_tokens_per_s']:.1f} tok/s; identical tokens: "
            f"{report['identical']}; max |logit diff| {report['max_abs_logit_diff']}"
        )


_COMMANDS = {
    "slice": cmd_slice,
    "assemble": cmd_assemble,
    "generate": cmd_generate,
    "demo": cmd_demo,
    "hardware": cmd_hardware,
}


if __name__ == "__main__":
    raise SystemExit(main())
