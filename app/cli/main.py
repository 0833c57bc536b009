"""The `sangama` command. Headless: imports no Qt, so servers and CI can run it."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.cli.arguments import (
    add_chat_sampling,
    add_sampling,
    chat_sampling,
    parse_bytes,
    parse_cpus,
    parse_cuts,
    parse_layers,
    parse_row_budget,
    parse_threads,
    parse_token_ids,
    parse_when,
    sampling,
)
from app.cli.pieces_commands import add_commands as add_pieces_commands
from app.cli.swarm_commands import add_commands as add_swarm_commands
from app.errors import AppError, ConfigError
from app.log_limits import limit_repeats
from app.parent_watch import maybe_watch_parent
from coordinator.errors import CoordinatorError
from coordinator.invites import InviteError
from core.errors import CoreError
from core.guessing import GUESS_CHOICES
from core.types import BackendReport
from net.errors import NetError

# core.models' names, written out: importing it here would load numpy for every command.
MODEL_HELP = "'default' (SmolLM2 135M Instruct), gemma-3-270m (a base model), or a GGUF path"


def version_text() -> str:
    """The line `sangama --version` prints, from the installed packages' metadata (the
    engine's too, read without loading it): what a volunteer quotes in a bug report."""
    from importlib.metadata import PackageNotFoundError, version

    def of(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    return f"sangama {of('sangama')} (engine: llama-cpp-python {of('llama_cpp_python')})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sangama", description="Run one large language model across many PCs."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("slice", help="cut a GGUF model into per-layer pieces and a manifest")
    p.add_argument(
        "model", help="GGUF file (the first shard, -00001-of-N, of a split model), or 'default'"
    )
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument(
        "--progress",
        action="store_true",
        help="draw the progress bar on stderr even when it is not a terminal",
    )

    p = sub.add_parser("assemble", help="build a stage GGUF for layers [start, stop) from pieces")
    p.add_argument("pieces", type=Path, help="directory holding manifest.json and the pieces")
    p.add_argument("--layers", required=True, type=parse_layers, help="START:STOP, e.g. 6:12")
    p.add_argument("--out", required=True, type=Path, help="stage GGUF to write")

    p = sub.add_parser("generate", help="chain stages in one process and generate")
    p.add_argument("--model", default="default", help=MODEL_HELP)
    p.add_argument(
        "--cuts", type=parse_cuts, default=None, help="e.g. 0,10,20,30 (default: 3 even stages)"
    )
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument(
        "--prompt-tokens",
        type=parse_token_ids,
        default=None,
        help="the prompt as token ids, e.g. 1,5,17 (models without a tokenizer)",
    )
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
    add_sampling(p)

    p = sub.add_parser("demo", help="a whole swarm on loopback answers one question")
    p.add_argument(
        "--prompt",
        default=None,
        help="default: a question for a chat model, a sentence to finish for a base model",
    )
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--model", default="default", help=MODEL_HELP)
    p.add_argument("--stages", type=int, default=3, help="workers the model is spread over")
    p.add_argument(
        "--static",
        action="store_true",
        help="skip the coordinator: fixed cuts, certificates made locally",
    )
    p.add_argument(
        "--cuts", type=parse_cuts, default=None, help="with --static (default: even --stages)"
    )
    p.add_argument("--wire-dtype", choices=["f32", "bf16"], default="f32")
    p.add_argument(
        "--api-port",
        type=int,
        default=None,
        help="keep the swarm running with an OpenAI-compatible API on 127.0.0.1:PORT until Ctrl+C",
    )

    p = sub.add_parser("worker", help="serve one stage (headless)")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--config", type=Path, help="static worker TOML file")
    how.add_argument(
        "--join",
        metavar="CODE",
        help="join with an invite, then serve what the coordinator assigns",
    )
    how.add_argument(
        "--identity", type=Path, help="serve as an already joined node (identity directory)"
    )
    p.add_argument(
        "--identity-dir", type=Path, default=None, help="where --join keeps the identity"
    )
    p.add_argument(
        "--listen",
        default=None,
        help="UDP HOST:PORT for QUIC (coordinated mode; default: this machine's address on "
        "its route to the coordinator, a free port)",
    )
    p.add_argument("--advertise", default=None, help="address peers should dial, if not --listen")
    p.add_argument("--vram-cap", default="0", help="memory to offer, e.g. 12G (default: all free)")
    p.add_argument(
        "--threads",
        type=parse_threads,
        default=1,
        help="compute threads, or auto: time the stage's step at 1..n threads at start",
    )
    p.add_argument(
        "--cpus",
        type=parse_cpus,
        default="",
        metavar="LIST",
        help="keep the compute threads on these CPUs, e.g. 0-3 (several stages on one PC)",
    )
    p.add_argument(
        "--quic", choices=["aioquic", "qh3"], default="qh3"
    )  # net.quic.links.DEFAULT_LIBRARY
    p.add_argument("--relay-only", action="store_true", help="reach peers only via the relay")
    p.add_argument(
        "--no-peer-pieces",
        action="store_true",
        help="neither serve the pieces held to other swarm members nor fetch pieces from them",
    )
    p.add_argument(
        "--coordinator",
        default=None,
        metavar="URL",
        help="talk to this coordinator instead of the one the invite named (it moved)",
    )
    p.add_argument(
        "--available-until",
        default=None,
        metavar="WHEN",
        help="when this PC stops serving (ISO date-time, e.g. 2026-12-24T18:00+01:00): "
        "the coordinator keeps a spare ready for its stage",
    )
    p.add_argument(
        "--drain",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="on stop or a new assignment, let running sessions finish this long (default 20)",
    )
    p.add_argument(
        "--quiet-hours",
        default="",
        metavar="HH:MM-HH:MM[,...]",
        help="local times not to serve, e.g. 22:00-07:00 (over midnight is fine)",
    )
    p.add_argument(
        "--no-gpu-pause", action="store_true", help="keep serving while other programs use the GPU"
    )
    p.add_argument("--no-battery-pause", action="store_true", help="keep serving on battery")
    p.add_argument("--max-download", default="0", help="piece download cap per second, e.g. 5M")
    p.add_argument("--max-upload", default="0", help="upload cap per second for links, e.g. 2M")
    p.add_argument(
        "--pieces-cap",
        default="0",
        metavar="SIZE",
        help="disk the model pieces may take, e.g. 50G (default: half the free space); "
        "pieces of stages no longer served are evicted, least recently used first",
    )
    p.add_argument(
        "--reproducible",
        action="store_true",
        help="each session decoded on its own, no batching across sessions (the same tokens"
        " as batched; for measuring what batching gains)",
    )
    p.add_argument(
        "--row-budget",
        type=parse_row_budget,
        default=0,
        metavar="ROWS",
        help="rows per engine step, instead of timing a few batch sizes at start",
    )

    p = sub.add_parser("chat", help="ask the swarm; stream the answer")
    p.add_argument("--prompt", required=True)
    p.add_argument(
        "--join",
        metavar="CODE",
        default=None,
        help="a client invite: joins once, and the same command asks again later",
    )
    p.add_argument(
        "--identity",
        type=Path,
        default=None,
        help="a joined client's identity dir (default: the one sangama join keeps)",
    )
    p.add_argument("--route", type=Path, default=None, help="route JSON file (static swarm)")
    p.add_argument("--credentials", type=Path, default=None, help="dir with ca.pem, NODE.pem/.key")
    p.add_argument("--node-id", default="client", help="certificate name with --credentials")
    p.add_argument(
        "--model",
        default=None,
        help="as a joined client: which of the swarm's models answers (default: the "
        "swarm's first); with --route: the GGUF with the tokenizer",
    )
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--raw", action="store_true", help="send the prompt without the chat template")
    p.add_argument("--wire-dtype", choices=["f32", "bf16"], default="f32")
    p.add_argument(
        "--guesses",
        choices=GUESS_CHOICES,
        default="adaptive",
        help="guess tokens ahead from the text (n-gram), verified in the same trip: "
        "adaptive (default) stops guessing where it does not pay",
    )
    add_chat_sampling(p)

    p = sub.add_parser(
        "api", help="serve an OpenAI-compatible API (/v1) on localhost, answered by the swarm"
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--host", default="127.0.0.1", help="listen address (the API has no auth: keep it local)"
    )
    p.add_argument(
        "--identity", type=Path, default=None, help="a joined client's identity dir (default)"
    )
    p.add_argument("--route", type=Path, default=None, help="route JSON file (static swarm)")
    p.add_argument("--credentials", type=Path, default=None, help="dir with ca.pem, NODE.pem/.key")
    p.add_argument("--node-id", default="client", help="certificate name with --credentials")
    p.add_argument("--model", default=None, help="GGUF with the tokenizer (static swarm)")
    p.add_argument(
        "--max-concurrent", type=int, default=256, help="requests answered at once (sessions)"
    )

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

    p = sub.add_parser(
        "hardware", help="show the memory this machine can offer and what llama.cpp runs on"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _COMMANDS.update(add_swarm_commands(sub))
    _COMMANDS.update(add_pieces_commands(sub))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    maybe_watch_parent()  # a child of the demo or a test ends with its parent
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for log_handler in logging.getLogger().handlers:
        limit_repeats(log_handler)  # a warning repeated every beat is shown once a minute
    handler = _COMMANDS[args.command]
    try:
        return handler(args)
    # Every package's own errors, and the system's (a file that cannot be written): one
    # line for the person, the traceback only with --verbose.
    except (CoreError, AppError, NetError, CoordinatorError, InviteError, OSError) as exc:
        logging.getLogger(__name__).debug("sangama %s failed", args.command, exc_info=True)
        print(f"sangama {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


# ---------------------------------------------------------------- commands


def cmd_slice(args: argparse.Namespace) -> int:
    from app.cli.progress import ProgressBar
    from core.gguf_slices import slice_model
    from core.models import resolve_model

    model = resolve_model(args.model)
    bar = ProgressBar(sys.stderr) if args.progress or sys.stderr.isatty() else None
    try:
        # A run cut short keeps its finished pieces: the same command resumes it.
        manifest = slice_model(model, args.out, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    f = manifest.facts
    print(
        f"wrote {len(manifest.pieces)} pieces and manifest.json to {args.out} "
        f"({f.architecture}, {f.n_layer} layers, n_embd {f.n_embd}, vocab {f.n_vocab})"
    )
    return 0


def cmd_assemble(args: argparse.Namespace) -> int:
    from core.gguf_slices import assemble_stage
    from core.model_inputs import pieces_manifest, stage_layers

    manifest = pieces_manifest(args.pieces)
    layers = stage_layers(manifest.facts, args.layers)
    out = assemble_stage(manifest, args.pieces, layers, args.out)
    print(f"wrote stage {layers} to {out}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from app.lab.local_run import run_generate

    report = run_generate(
        model=args.model,
        cuts=args.cuts,
        prompt=args.prompt,
        prompt_tokens=args.prompt_tokens,
        chat=args.chat,
        max_tokens=args.max_tokens,
        sampling=sampling(args),
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
    import asyncio

    if args.static:
        if args.api_port is not None:
            from app.lab.demo import serve_local_swarm

            return asyncio.run(
                serve_local_swarm(args.model, args.cuts, port=args.api_port, stages=args.stages)
            )
        from app.lab.demo import run_demo

        return run_demo(
            args.model, args.cuts, args.prompt, args.max_tokens, args.wire_dtype, args.stages
        )
    from app.lab.demo_swarm import run_demo_swarm
    from net.wire.tensors import WireDtype

    dtype = WireDtype[args.wire_dtype.upper()]
    return asyncio.run(
        run_demo_swarm(
            args.model, args.stages, args.prompt, args.max_tokens, dtype, api_port=args.api_port
        )
    )


def cmd_worker(args: argparse.Namespace) -> int:
    if args.config is not None:
        from app.serving.serve import run_worker

        return run_worker(args.config)
    from app.config import parse_address
    from app.identity import coordinator_url, default_identity_dir
    from app.serving.coordinated import CoordinatedOptions
    from app.serving.guest.loop import run_guest
    from app.serving.guest.policy import GuestSettings, SettingsError, parse_quiet_hours

    if not (0 <= args.drain <= 3600):
        raise ConfigError(f"--drain must be 0..3600 seconds, not {args.drain}")
    if args.cpus:
        from app.serving.machine.cpus import refuse_unusable
        from core.cpu_placement import parse_cpu_list

        cpus = parse_cpu_list(args.cpus)
        refuse_unusable(cpus)
        if args.threads > len(cpus):  # as WorkerConfig says, before joining, not after
            raise ConfigError(
                f"--threads {args.threads} needs as many CPUs, --cpus has {len(cpus)}"
            )
    try:
        guest = GuestSettings(
            pause_when_gpu_busy=not args.no_gpu_pause,
            pause_on_battery=not args.no_battery_pause,
            quiet_hours=parse_quiet_hours(args.quiet_hours),
            download_bytes_per_s=parse_bytes(args.max_download),
            upload_bytes_per_s=parse_bytes(args.max_upload),
        )
    except SettingsError as exc:
        raise ConfigError(str(exc)) from exc
    pieces_cap = parse_bytes(args.pieces_cap)
    if pieces_cap < 0:
        raise ConfigError(
            f"--pieces-cap must be 0 (the default) or a size like 50G, not {args.pieces_cap!r}"
        )
    return run_guest(
        CoordinatedOptions(
            identity_dir=args.identity or args.identity_dir or default_identity_dir(),
            join_code=args.join,
            listen=parse_address(args.listen) if args.listen else None,
            advertise=args.advertise,
            vram_cap_bytes=parse_bytes(args.vram_cap),
            threads=args.threads,
            cpus=args.cpus,
            quic_library=args.quic,
            relay_only=args.relay_only,
            share_pieces=not args.no_peer_pieces,
            coordinator=coordinator_url(args.coordinator) if args.coordinator else None,
            drain_s=args.drain,
            available_until=parse_when(args.available_until),
            download_bytes_per_s=guest.download_bytes_per_s,
            upload_bytes_per_s=guest.upload_bytes_per_s,
            pieces_cap_bytes=pieces_cap,
            reproducible=args.reproducible,
            row_budget=args.row_budget,
        ),
        guest,
    )


def cmd_chat(args: argparse.Namespace) -> int:
    from app.cli.chat import run_chat_cli

    identity = args.identity
    if args.route is None and (identity is None or args.join):
        from app.identity import default_identity_dir, join_or_resume

        identity = identity or default_identity_dir()
        if args.join:
            joined, resumed = join_or_resume(args.join, identity, folder_flag="--identity")
            if not resumed:
                print(f"joined as {joined.node_id} ({joined.role})", file=sys.stderr)
    return run_chat_cli(
        route_path=args.route,
        credentials=args.credentials,
        identity=identity,
        node_id=args.node_id,
        model=args.model,
        prompt=args.prompt,
        max_tokens=args.max_tokens,
        chat_format=not args.raw,
        sampling=chat_sampling(args),
        wire_dtype=args.wire_dtype,
        guesses=args.guesses,
    )


def cmd_api(args: argparse.Namespace) -> int:
    from app.api.openai_serve import run_api_cli

    identity = args.identity
    if identity is None and args.route is None:
        from app.identity import default_identity_dir

        identity = default_identity_dir()
    return run_api_cli(
        identity=identity,
        route_path=args.route,
        credentials=args.credentials,
        node_id=args.node_id,
        model=args.model,
        host=args.host,
        port=args.port,
        max_concurrent=args.max_concurrent,
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
    from app.cli.hardware_view import format_hardware, hardware_document
    from core.hardware import detect_hardware

    backend = _backend_report()
    hardware = detect_hardware()
    if args.json:
        print(json.dumps(hardware_document(hardware, backend), indent=1))
    else:
        print(format_hardware(hardware, backend))
    # The memory report still printed; the status says the engine cannot run here.
    return 1 if isinstance(backend, str) else 0


def _backend_report() -> BackendReport | str:
    """core.backends' report, or why the engine library could not be loaded (a string):
    this command is what a volunteer runs to find that out, so it must not crash."""
    from core.errors import ModelLoadError

    try:
        from core.backends import backend_report

        report: BackendReport = backend_report()
        return report
    except (ModelLoadError, ImportError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"


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
    "api": cmd_api,
    "ca": cmd_ca,
    "hardware": cmd_hardware,
}
