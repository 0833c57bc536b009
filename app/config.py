"""Static worker configuration and client routes, read from TOML/JSON files."""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from app.errors import ConfigError
from coordinator.contract import MAX_FAULTY_LISTED
from core.cpu_placement import CpuListError, parse_cpu_list
from core.types import LayerRange
from net.quic.links import DEFAULT_LIBRARY


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not (0 <= int(port) <= 65535):
        raise ConfigError(f"address must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def format_address(addr: tuple[str, int]) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class Hop:
    node_id: str
    address: tuple[str, int]


_STRUCTURED = frozenset({"node_id", "listen", "model", "layers", "credentials", "next_hop"})
"""WorkerConfig fields that from_dict builds itself (addresses, paths, ranges)."""


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is a JSON string for these values
    return repr(value)


def _typed(name: str, default: object, value: object) -> Any:
    """`value` as the type of the field's default: TOML and JSON give ints for floats and
    strings for everything a hand-edited file gets wrong; a bool must be a real bool."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, not {value!r}")
        return value
    if isinstance(default, int):
        return int(value)  # type: ignore[call-overload]
    if isinstance(default, float):
        return float(value)  # type: ignore[arg-type]
    if isinstance(default, str):
        return str(value)
    raise ConfigError(f"{name}: no reader for settings of type {type(default).__name__}")


REMOVED_SETTINGS = {
    "inline_step_ms": "steps always run on the engine thread; delete the line "
    "(docs/decisions/inline-engine-steps.md)",
}
"""Settings older files may carry, and what to do about each: a file naming one is
refused with that advice rather than run as if the setting still applied."""


@dataclass(frozen=True)
class WorkerConfig:
    node_id: str
    listen: tuple[str, int]
    model: str
    """"default", a GGUF path, or a pieces directory holding manifest.json."""
    layers: LayerRange
    credentials: Path
    """Directory holding ca.pem and <node_id>.pem / <node_id>.key."""
    next_hop: Hop | None = None
    threads: int = 1
    """Compute threads of the stage; 0 ("auto"): time a one-row step at 1..n threads at
    start and keep the fewest within 10% of the fastest (app/serving/thread_calibration)."""
    cpus: str = ""
    """CPUs for the stage's compute threads, as taskset writes them ("0-3", "0,2"): the
    thread that runs a step on the first, the rest of its OpenMP team on the others, each
    its own (app/serving/compute_cpus). For several stages sharing one PC; "" (default):
    the scheduler places them. At least `threads` CPUs; Linux only."""
    max_sessions: int = 8
    n_ctx: int = 2048
    """Positions each session may hold (prompt and answer): every session has a KV
    stream of its own, so the stage allocates n_ctx * max_sessions positions."""
    row_budget: int = 256
    """Rows per llama_decode at most (llama.cpp's n_batch): decode rows of all sessions
    first, then prompt chunks. The budget used is measured at start, up to this."""
    calibrate_budget: bool = True
    """Time a few batch sizes at start and take the row budget from them
    (core.scheduling.choose_row_budget); False: use row_budget as it is."""
    reproducible: bool = False
    """Every session's rows in a llama_decode of their own: batching across sessions
    given up. A request gives the tokens it gives alone either way; this is kept to
    measure what batching gains."""
    exact_guesses: bool = True
    """Stages before the last evaluate a step's guessed rows one at a time, each as plain
    decoding computes it, so guessing never changes an answer (llama.cpp's multi-row
    kernels for repacked weights round differently and can flip a near-tie). False: all
    of a step's rows in one decode, faster where compute, not the links, is the cost.
    Not for recurrent models (qwen35): their undo needs the rows in one decode."""
    max_datagram_size: int = 1200
    quic_library: str = DEFAULT_LIBRARY
    """"qh3" (default) or "aioquic" (see net.quic.links)."""
    return_logits: bool = False
    """Diagnostics: the last stage sends the logits each token was chosen from."""
    idle_timeout: float = 5.0
    """Seconds of silence after which a link's path counts as dead (QUIC idle timeout)."""
    relink_timeout: float = 20.0
    """How long a worker tries to re-establish a lost link to its next stage (direct,
    then ICE, then the relay) before failing the sessions that crossed it."""
    resume_grace: float = 30.0
    """How long sessions of a lost upstream worker link wait here to be resumed."""
    auth_timeout: float = 10.0
    """Seconds a peer has, from its first datagram, to prove who it is; its link is
    closed after (net.peer_limits)."""
    session_idle_s: float = 120.0
    """A session with no step taken or answered for this long is closed and its KV freed
    (app.serving.rules.peers.idle_sessions): a client gone or holding slots idle."""
    max_sessions_per_node: int = 0
    """First stage: sessions one client node may hold at once; 0: all but a quarter of
    `max_sessions` (app.serving.rules.peers.per_node_sessions)."""
    upstream: str = ""
    """Node ids (comma-separated) of the stage before this one: only they may open
    sessions here. "": not known (any node certified as a worker; never a client)."""
    advertise: str = ""
    """HOST:PORT peers dial this stage at, where not `listen` (a port forward, a proxy):
    a first stage lets a client's ring (`Open.loop`) point only here or at `listen`."""
    use_gpu: bool = True
    """Offload the stage's blocks to a GPU where one is found."""
    device_cap_bytes: int = 0
    """The most GPU memory the stage may take (the volunteer's VRAM cap); 0: all free."""
    upload_bytes_per_s: int = 0
    """The volunteer's upload cap for everything this stage's links send; 0: none."""
    mtp_guesses: int = 6
    """Last stage of a model with an MTP head: guesses it sends back per token, at most
    (every stage's recurrent snapshots, n_rs_seq = 8, bound how many can be undone)."""
    mtp_p_min: float = 0.3
    """The head stops guessing once its probability for a guess falls below this."""

    def __post_init__(self) -> None:
        if self.quic_library not in ("aioquic", "qh3"):
            raise ConfigError(f"quic_library must be aioquic or qh3, not {self.quic_library!r}")
        if self.threads < 0 or self.max_sessions < 1 or self.row_budget < 1:
            raise ConfigError("threads must be >= 0 (0: auto), max_sessions and row_budget >= 1")
        if not (0 <= self.mtp_guesses <= 8 and 0.0 <= self.mtp_p_min <= 1.0):
            raise ConfigError("mtp_guesses must be in 0..8 and mtp_p_min in [0, 1]")
        try:
            cpus = parse_cpu_list(self.cpus)
        except CpuListError as exc:
            raise ConfigError(f"cpus: {exc}") from exc
        if cpus and self.threads > len(cpus):
            raise ConfigError(f"threads = {self.threads} need as many CPUs, cpus names {len(cpus)}")
        if cpus and not hasattr(os, "sched_setaffinity"):
            raise ConfigError("cpus: this platform cannot pin threads (no sched_setaffinity)")
        if self.max_sessions_per_node < 0:
            raise ConfigError("max_sessions_per_node must be >= 0 (0: the default share)")
        if self.advertise:
            parse_address(self.advertise)
        for name in ("idle_timeout", "relink_timeout", "resume_grace", "auth_timeout",
                     "session_idle_s"):  # fmt: skip
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value < 86400):
                raise ConfigError(f"{name} must be a positive number of seconds, not {value!r}")

    @property
    def upstream_nodes(self) -> frozenset[str] | None:
        """`upstream` as node ids; None where it names none."""
        nodes = frozenset(n.strip() for n in self.upstream.split(",") if n.strip())
        return nodes or None

    @property
    def cpu_list(self) -> tuple[int, ...]:
        """`cpus` as CPU numbers; () where none are chosen."""
        return parse_cpu_list(self.cpus)

    @staticmethod
    def from_dict(doc: dict[str, Any], base: Path = Path(".")) -> WorkerConfig:
        try:
            start, stop = doc["layers"]
            hop = doc.get("next_hop")
            creds = Path(doc["credentials"])
            # Every plain setting is read by its field's name and default type, so a new
            # setting cannot be forgotten here (upload_bytes_per_s, use_gpu and the VRAM
            # cap once were). An unknown key is an error, not silently ignored.
            removed = sorted(set(doc) & set(REMOVED_SETTINGS))
            if removed:
                raise ConfigError(
                    "; ".join(
                        f"worker setting {k!r} was removed: {REMOVED_SETTINGS[k]}" for k in removed
                    )
                )
            unknown = set(doc) - {f.name for f in fields(WorkerConfig)}
            if unknown:
                raise ConfigError(f"unknown worker setting(s): {', '.join(sorted(unknown))}")
            plain = {
                f.name: _typed(f.name, f.default, doc[f.name])
                for f in fields(WorkerConfig)
                if f.name not in _STRUCTURED and f.name in doc
            }
            return WorkerConfig(
                node_id=str(doc["node_id"]),
                listen=parse_address(str(doc["listen"])),
                model=str(doc.get("model", "default")),
                layers=LayerRange(int(start), int(stop)),
                credentials=creds if creds.is_absolute() else base / creds,
                next_hop=Hop(str(hop["node_id"]), parse_address(str(hop["address"])))
                if hop
                else None,
                **plain,
            )
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"bad worker configuration: {exc!r}") from exc

    @staticmethod
    def load(path: Path) -> WorkerConfig:
        return WorkerConfig.from_dict(_read(path), path.parent)

    def to_toml(self) -> str:
        lines = [
            f'node_id = "{self.node_id}"',
            f'listen = "{format_address(self.listen)}"',
            f'model = "{self.model}"',
            f"layers = [{self.layers.start}, {self.layers.stop}]",
            f'credentials = "{self.credentials}"',
        ]
        lines += [
            f"{f.name} = {_toml_value(getattr(self, f.name))}"
            for f in fields(self)
            if f.name not in _STRUCTURED
        ]
        if self.next_hop is not None:
            lines += [
                "",
                "[next_hop]",
                f'node_id = "{self.next_hop.node_id}"',
                f'address = "{format_address(self.next_hop.address)}"',
            ]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class RouteStage:
    node_id: str
    address: tuple[str, int]
    layers: LayerRange


@dataclass(frozen=True)
class Route:
    model: str
    stages: tuple[RouteStage, ...]
    faulty: tuple[str, ...] = field(default=(), compare=False)
    """Nodes the swarm's spot checks found computing wrong, as the coordinator listed them
    with this route (app.client.recovering replays what passed through one); not part of
    which chain this is."""

    def __post_init__(self) -> None:
        if not self.stages:
            raise ConfigError("a route needs at least one stage")
        for a, b in zip(self.stages, self.stages[1:], strict=False):
            if a.layers.stop != b.layers.start:
                raise ConfigError(f"route has a gap or overlap between {a.layers} and {b.layers}")
        if self.stages[0].layers.start != 0:
            raise ConfigError("a route must start at layer 0")

    @property
    def first(self) -> RouteStage:
        return self.stages[0]

    @property
    def last(self) -> RouteStage:
        return self.stages[-1]

    @staticmethod
    def from_dict(doc: dict[str, Any]) -> Route:
        try:
            stages = tuple(
                RouteStage(
                    str(s["node_id"]),
                    parse_address(str(s["address"])),
                    LayerRange(int(s["layers"][0]), int(s["layers"][1])),
                )
                for s in doc["stages"]
            )
            faulty = doc.get("faulty", ())
            if not isinstance(faulty, (list, tuple)) or len(faulty) > MAX_FAULTY_LISTED:
                raise ConfigError(f"a route lists at most {MAX_FAULTY_LISTED} faulty nodes")
            return Route(str(doc.get("model", "default")), stages, tuple(map(str, faulty)))
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ConfigError(f"bad route: {exc!r}") from exc

    @staticmethod
    def load(path: Path) -> Route:
        return Route.from_dict(_read(path))

    def to_json(self) -> str:
        return json.dumps(
            {
                "model": self.model,
                "stages": [
                    {
                        "node_id": s.node_id,
                        "address": format_address(s.address),
                        "layers": [s.layers.start, s.layers.stop],
                    }
                    for s in self.stages
                ],
            },
            indent=1,
        )


def _read(path: Path) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    is_json = str(path).endswith(".json")
    try:
        doc = json.loads(text) if is_json else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path} is not valid {'JSON' if is_json else 'TOML'}: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{path} must hold a table/object")
    return doc
