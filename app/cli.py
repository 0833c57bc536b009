"""The `sangama` command. Headless: imports no Qt, so servers and CI can run it."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.errors import AppError
from core.errors import CoreError
from core.types import LayerRange, SamplingParams
from net.errors import NetError

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

    p = sub.add_parser("demo", help="a whole swarm on loopback answers one question")
    p.add_argument("--prompt", default=DEMO_QUESTION)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--model", default="default")
    p.add_argument("--cuts", type=_parse_cuts, default=[0, 6, 12, 18])
    p.add_argument("--wire-dtype", choices=["f32", "bf16"], default="f32")

    p = sub.add_parser("worker", help="serve one stage (headless)")
    p.add_argument("--config", required=True, type=Path, help="worker TOML file")

    p = sub.add_parser("chat", help="ask the swarm along a route; stream the answer")
    p.add_argument("--route", required=True, type=Path, help="route JSON file")
    p.add_argument("--prompt", required=True)
    p.add_argument(
        "--credentials", required=True, type=Path, help="directory with ca.pem and NODE.pem/.key"
    )
    p.add_argument("--node-id", default="client", help="this client's node id (certificate name)")
    p.add_argument(
        "--model", default=None, help="GGUF holding the tokenizer (default: the route's model)"
    )
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument(
        "--raw", action="store_true", help="send the prompt as is, without the chat template"
    )
    p.add_argument("--wire-dtype", choices=["f32", "bf16"], default="f32")
    _add_sampling(p)

    p = sub.add_parser("ca", help="the swarm certificate authority")
    ca_sub = p.add_subparsers(dest="ca_command", required=True)
    q = ca_sub.add_parser("init", help="create a swarm CA in DIR")
    q.add_argument("dir", type=Path)
    q.add_argument("--name", default="sangama-swarm")
    q = ca_sub.add_parser("issue", help="issue a node certificate")
    q.add_argument("node_id")
    q.add_argument("--ca", required=True, type=Path, help="directory holding ca.pem and ca.key")
    q.add_argument("--role", choices=["worker", "client", "coordinator"], default="worker")
    q.add_argument(
        "--out", type=Path, default=None, help="credentials directory to write (default: --ca)"
    )
    q.add_argument("--hours", type=int, default=24 * 7)

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
    except (CoreError, AppError, NetError) as exc:
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
    from app.demo import run_demo

    return run_demo(args.model, args.cuts, args.prompt, args.max_tokens, args.wire_dtype)


def cmd_worker(args: argparse.Namespace) -> int:
    from app.serve import run_worker

    return run_worker(args.config)


def cmd_chat(args: argparse.Namespace) -> int:
    from app.demo import run_chat_cli

    return run_chat_cli(
        route_path=args.route,
        credentials=args.credentials,
        node_id=args.node_id,
        model=args.model,
        prompt=args.prompt,
        max_tokens=args.max_tokens,
        chat_format=not args.raw,
        sampling=_sampling(args),
        wire_dtype=args.wire_dtype,
    )


def cmd_ca(args: argparse.Namespace) -> int:
    from app.credentials import init_ca, issue_node
    from net.auth import fingerprint

    if args.ca_command == "init":
        ca = init_ca(args.dir, args.name)
        print(f"created swarm CA in {args.dir} (fingerprint {fingerprint(ca.certificate)})")
        return 0
    out = issue_node(args.ca, args.node_id, args.role, out_dir=args.out, hours=args.hours)
    print(f"issued {args.role} certificate for {args.node_id} in {out}")
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
    "worker": cmd_worker,
    "chat": cmd_chat,
    "ca": cmd_ca,
    "hardware": cmd_hardware,
}


if __name__ == "__main__":
    raise SystemExit(main())
