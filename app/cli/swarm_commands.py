"""`sangama coordinator`, `sangama invite ...`, `sangama join`: the swarm's front door."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

Handler = Callable[[argparse.Namespace], int]


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Handler]:
    p = sub.add_parser(
        "coordinator", help="run the swarm's coordinator (HTTPS API + operator page)"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8443)
    p.add_argument("--db", default=None, help="SQLAlchemy URL (default: SQLite file in --data)")
    p.add_argument("--data", type=Path, default=None, help="data directory (CA, pieces, secrets)")
    p.add_argument(
        "--model",
        action="append",
        default=None,
        help="'default' (SmolLM2 135M Instruct), gemma-3-270m (a base model), a GGUF path, "
        "a folder of pieces from `sangama slice`, or the https:// URL of a published GGUF "
        "(its first shard): volunteers then fetch the tensor bytes from there. Repeat it "
        "to host several models: the first is the default, the workers are split between "
        "them (each model's chain in turn, the spares shared)",
    )
    p.add_argument(
        "--keep-pieces",
        action="store_true",
        help="with --model URL: keep a copy of the pieces here too (default: only the "
        "manifest; a volunteer whose mirror fails gets its piece through this coordinator)",
    )
    p.add_argument("--public-url", default=None, help="address written into invites")
    p.add_argument(
        "--admin-password-file",
        type=Path,
        default=None,
        help="file holding the operator password (or set SANGAMA_ADMIN_PASSWORD; "
        "default: generated into DATA/admin-password)",
    )
    p.add_argument(
        "--admin-password", default=None, help="deprecated: visible in ps; use the file or variable"
    )
    p.add_argument(
        "--min-stages",
        type=int,
        default=2,
        help="spread the model over at least N workers (default 2: no single worker sees "
        "every prompt and picks every answer)",
    )
    p.add_argument("--spares", type=int, default=0, help="healthy workers kept out of the chain")
    p.add_argument(
        "--cold-spares",
        action="store_true",
        help="spares download a stage's pieces only once they take it over (default: they "
        "get the stage most at risk ready in advance)",
    )
    p.add_argument("--turn", default=None, help="the swarm relay's HOST:PORT (sangama relay)")
    p.add_argument("--turn-secret-file", type=Path, default=None, help="the relay's shared secret")
    p.add_argument(
        "--trusted-proxy",
        action="append",
        default=[],
        metavar="IP[/BITS]",
        help="a reverse proxy in front of the coordinator: the caller's address is read from "
        "its X-Forwarded-For (repeatable; by default no header is believed)",
    )
    p.add_argument(
        "--trusted-ends",
        choices=["off", "prefer", "require"],
        default="off",
        help="put the first stage (reads prompts) and the last (picks answers) on nodes you "
        "marked trusted on the operator page",
    )
    p.add_argument(
        "--answer-probe-every",
        type=float,
        default=45.0,
        metavar="SECONDS",
        help="ask the planned chain for two tokens this often, and after every re-plan "
        "(0: never): the operator page says whether the swarm can answer",
    )
    p.add_argument(
        "--max-chains",
        type=int,
        default=1,
        metavar="N",
        help="complete chains to form when there are workers enough (1: one chain, the "
        "rest spares); stages of the same layers in two chains can check each other",
    )
    p.add_argument(
        "--spot-check-rate",
        type=float,
        default=0.01,
        metavar="SHARE",
        help="share of reproducible stages' steps recomputed by another node serving the "
        "same layers (0: no spot checks in this swarm); a stage caught lying leaves the routes",
    )
    p.add_argument("--stale-after", type=float, default=15.0, help="seconds of silence: stale")
    p.add_argument(
        "--min-release",
        default=None,
        help="the oldest Sangama release this swarm admits at join and heartbeat (default: "
        "the oldest that speaks this release's wire; '' admits every release)",
    )
    p.add_argument(
        "--latest-release",
        default="",
        help="the newest Sangama release, as the operator announces it: the tray and "
        "`sangama status` tell volunteers on older ones to update",
    )
    p.add_argument(
        "--dead-after", type=float, default=45.0, help="seconds of silence: replaced in the plan"
    )

    p = sub.add_parser("invite", help="create, list or revoke invitations")
    isub = p.add_subparsers(dest="invite_command", required=True)
    q = isub.add_parser("create", help="create an invite; the code is the last line printed")
    q.add_argument("--role", choices=["worker", "client"], required=True)
    q.add_argument("--uses", type=int, default=1)
    q.add_argument("--expires", default="7d", help="e.g. 7d, 12h, 30m")
    q.add_argument("--note", default="")
    _db_args(q)
    q = isub.add_parser("list", help="list invites")
    _db_args(q)
    q = isub.add_parser("revoke", help="revoke an invite by id")
    q.add_argument("id", type=int)
    _db_args(q)

    p = sub.add_parser("relay", help="run the swarm's TURN/STUN relay (configures coturn)")
    from app.cli.relay import add_relay_arguments

    add_relay_arguments(p)

    p = sub.add_parser(
        "status",
        help="this node: identity, certificate, assignment, route; with --coordinator, the "
        "swarm as its operator sees it and the tokens/s it should deliver",
    )
    p.add_argument("--identity", type=Path, default=None, help="identity directory")
    p.add_argument(
        "--coordinator", default=None, help="operator view: the coordinator's URL (https://...)"
    )
    p.add_argument("--data", type=Path, default=None, help="the coordinator's data directory")
    p.add_argument("--token-file", type=Path, default=None, help="default: DATA/admin-token")
    p.add_argument("--ca", type=Path, default=None, help="default: DATA/ca/ca.pem")
    p.add_argument("--json", action="store_true", help="operator view as JSON")

    p = sub.add_parser("join", help="join a swarm with an invite code")
    p.add_argument("code")
    p.add_argument("--identity", type=Path, default=None, help="where to keep this node's identity")
    return {
        "coordinator": cmd_coordinator,
        "invite": cmd_invite,
        "join": cmd_join,
        "relay": cmd_relay,
        "status": cmd_status,
    }


def cmd_status(args: argparse.Namespace) -> int:
    """What the tray's status window shows, for servers and scripts; with --coordinator,
    what the operator page shows of the chain and its predicted tokens/s."""
    if args.coordinator:
        from app.cli.fleet_status import run_fleet_status
        from coordinator.server.serve import default_data_dir

        return run_fleet_status(args, default_data_dir())
    from app.identity import Identity, default_identity_dir
    from coordinator.errors import CoordinatorError
    from coordinator.releases import update_notice
    from core.types import format_layers
    from net.wire.versions import this_release

    me = Identity.load(args.identity or default_identity_dir())
    cert = me.certified.certificate
    print(f"node        {me.node_id} ({me.role})")
    print(f"coordinator {me.coordinator}")
    print(f"certificate valid until {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    client = me.client()
    try:
        health = client.health()
        notice = update_notice(this_release(), health.latest_release, health.min_release)
        print(f"release     {this_release()}" + (f": {notice}" if notice else " (current)"))
        assignment = client.assignment()
        if assignment:
            hop = assignment.next_hop
            nxt = f"next hop {hop.node_id} at {hop.address}" if hop else "last stage"
            print(f"stage       {format_layers(*assignment.layers)} ({nxt})")
        elif me.role == "worker":
            print("stage       none assigned (waiting, or kept as a spare)")
        route = client.route()
        chain = " -> ".join(f"{s.node_id} ({format_layers(*s.layers)})" for s in route.stages)
        print(f"route       {chain}")
    except CoordinatorError as exc:
        print(f"coordinator: {exc}")
        return 1
    return 0


def cmd_relay(args: argparse.Namespace) -> int:
    from app.cli.relay import run_relay_cli

    return run_relay_cli(args)


def _db_args(q: argparse.ArgumentParser) -> None:
    q.add_argument("--db", default=None, help="the coordinator's database URL")
    q.add_argument("--data", type=Path, default=None, help="the coordinator's data directory")
    q.add_argument("--coordinator", default=None, help="public URL written into the code")


def cmd_coordinator(args: argparse.Namespace) -> int:
    from app.cli.secret_args import ADMIN_PASSWORD_ENV, read_secret
    from app.config import parse_address
    from coordinator.server.serve import CoordinatorOptions, default_data_dir, serve
    from coordinator.server.service import CoordinatorSettings
    from coordinator.server.spot_policy import SpotSettings

    options = CoordinatorOptions(
        host=args.host,
        port=args.port,
        data_dir=args.data or default_data_dir(),
        db_url=args.db,
        model=(args.model or ["default"])[0],
        more_models=tuple((args.model or [])[1:]),
        keep_pieces=args.keep_pieces,
        public_url=args.public_url,
        admin_password=read_secret(
            args.admin_password,
            args.admin_password_file,
            ADMIN_PASSWORD_ENV,
            "--admin-password",
        ),
        answer_probe_every_s=args.answer_probe_every,
        settings=CoordinatorSettings(
            min_stages=args.min_stages,
            spares=args.spares,
            warm_spares=not args.cold_spares,
            stale_after_s=args.stale_after,
            dead_after_s=args.dead_after,
            turn_server=parse_address(args.turn) if args.turn else None,
            turn_secret=args.turn_secret_file.read_text().strip() if args.turn_secret_file else "",
            trusted_proxies=tuple(_networks(args.trusted_proxy)),
            trusted_ends=args.trusted_ends,
            min_release=_release_arg(args.min_release, "--min-release"),
            latest_release=_release_arg(args.latest_release, "--latest-release"),
            max_chains=max(1, args.max_chains),
            spot=SpotSettings(rate=min(1.0, max(0.0, args.spot_check_rate))),
        ),
    )
    return serve(options)


def _release_arg(value: str | None, flag: str) -> str:
    """A release flag's value, checked (DEFAULT_MIN_RELEASE where --min-release is not given)."""
    from coordinator.releases import DEFAULT_MIN_RELEASE
    from net.wire.versions import BadRelease, release_key

    if value is None:
        return DEFAULT_MIN_RELEASE
    if value:
        try:
            release_key(value)
        except BadRelease as exc:
            raise SystemExit(f"{flag}: {exc}") from None
    return value


def _networks(values: list[str]) -> list[str]:
    """--trusted-proxy values, each an IP or a network; a clear error for anything else."""
    import ipaddress

    try:
        return [str(ipaddress.ip_network(v, strict=False)) for v in values]
    except ValueError as exc:
        raise SystemExit(f"--trusted-proxy: {exc}") from None


def cmd_invite(args: argparse.Namespace) -> int:
    from coordinator import invites as inv
    from coordinator.errors import NotFound
    from coordinator.server.invite_book import create_invite, list_invites, revoke_invite
    from coordinator.server.serve import default_data_dir, default_db_url
    from coordinator.server.service import CA_CERT
    from coordinator.server.store import Store, migrate
    from net import auth

    url = args.db or default_db_url(args.data or default_data_dir())
    migrate(url)
    store = Store(url)
    try:
        if args.invite_command == "create":
            ca_pem = store.get_setting(CA_CERT)
            if ca_pem is None:
                print(
                    "sangama invite: error: start the coordinator once first (no CA yet)",
                    file=sys.stderr,
                )
                return 2
            public = args.coordinator or store.get_setting("public_url")
            if not public:
                print("sangama invite: error: --coordinator URL is required", file=sys.stderr)
                return 2
            fingerprint = auth.fingerprint(auth.load_certificate(ca_pem.encode()))
            invite_id, code = create_invite(
                store,
                public,
                fingerprint,
                args.role,
                args.uses,
                inv.parse_duration(args.expires),
                args.note,
            )
            print(f"invite {invite_id}: {args.role}, {args.uses} use(s), expires in {args.expires}")
            print(code)
        elif args.invite_command == "list":
            for row in reversed(list_invites(store)):  # oldest first, as the ids were given
                state = "revoked" if row.revoked else f"{row.uses_left}/{row.max_uses} left"
                print(
                    f"{row.id:4} {row.role:7} {state:12} "
                    f"expires {row.expires_at:%Y-%m-%d %H:%M} {row.note}"
                )
        else:
            try:
                revoke_invite(store, args.id)
            except NotFound:
                print(f"sangama invite: error: no invite {args.id}", file=sys.stderr)
                return 2
            print(f"invite {args.id} revoked")
        return 0
    finally:
        store.close()


def cmd_join(args: argparse.Namespace) -> int:
    from app.identity import default_identity_dir, join_or_resume

    identity, already = join_or_resume(
        args.code, args.identity or default_identity_dir(), folder_flag="--identity"
    )
    said = "already joined" if already else "joined"
    print(
        f"{said} {identity.coordinator} as {identity.node_id} ({identity.role}); "
        f"identity in {identity.directory}"
    )
    return 0
