"""The Debian packages a command needs: installed when run as root, else named in one line.

`python3 installers/system_packages.py ensure GROUP...` reads installers/system-packages.txt
(the one list, shared by the Makefile and .ci/run) and asks dpkg which of the groups'
packages are missing. As root it installs them with apt-get; otherwise it stops at once
with one line naming the command to run, so a first `make demo` on a fresh machine fails
in a second with the fix instead of half an hour later inside CMake. On a system without
dpkg (not Debian or Ubuntu) it says nothing and succeeds: the build reports what it lacks.

`list GROUP...` prints the groups' package names. Standard library only: it runs before
the virtual environment exists, under whatever python3 the machine has.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

LIST = Path(__file__).resolve().with_name("system-packages.txt")


class ListError(ValueError):
    """A line of the package list that does not parse."""


@dataclass(frozen=True)
class Requirement:
    group: str
    package: str
    alternatives: tuple[str, ...] = ()
    """`cmd:NAME` or `path:GLOB`: either one present counts as the package installed."""


def parse_list(text: str) -> tuple[Requirement, ...]:
    found: list[Requirement] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        if len(words) < 2:
            raise ListError(f"line {number}: want GROUP PACKAGE [ALTERNATIVE ...]: {raw!r}")
        for alt in words[2:]:
            if not alt.startswith(("cmd:", "path:")) or alt.endswith(":"):
                raise ListError(f"line {number}: {alt!r} is neither cmd:NAME nor path:GLOB")
        found.append(Requirement(words[0], words[1], tuple(words[2:])))
    return tuple(found)


def select(reqs: Iterable[Requirement], groups: Sequence[str]) -> tuple[Requirement, ...]:
    known = {r.group for r in reqs}
    unknown = sorted(set(groups) - known)
    if unknown:
        raise ListError(f"no group {', '.join(unknown)} (groups: {', '.join(sorted(known))})")
    return tuple(r for r in reqs if r.group in groups)


def installed_from_dpkg(output: str) -> frozenset[str]:
    """Installed package names in `dpkg-query -W -f='${Package} ${db:Status-Abbrev}\\n'`
    output: status "ii" (wanted install, installed); "rc" (removed, config left) is not."""
    names = set()
    for line in output.splitlines():
        words = line.split()
        if len(words) >= 2 and words[1] == "ii":
            names.add(words[0].split(":", 1)[0])  # "libfoo:amd64" on multi-arch systems
    return frozenset(names)


def _alternative_holds(alt: str, has_command: Callable[[str], bool]) -> bool:
    kind, _, what = alt.partition(":")
    return has_command(what) if kind == "cmd" else bool(glob.glob(what))


def missing(
    reqs: Iterable[Requirement],
    installed: frozenset[str],
    has_command: Callable[[str], bool] = lambda name: shutil.which(name) is not None,
) -> tuple[str, ...]:
    """The packages of `reqs` neither installed nor replaced by an alternative, in list
    order, each once."""
    out: list[str] = []
    for r in reqs:
        if r.package in installed or r.package in out:
            continue
        if any(_alternative_holds(a, has_command) for a in r.alternatives):
            continue
        out.append(r.package)
    return tuple(out)


def advice(packages: Sequence[str]) -> str:
    """The one line a user who is not root reads."""
    names = " ".join(packages)
    return f"missing Debian packages: {names} — run: sudo apt-get install {names}"


def dpkg_query(packages: Sequence[str]) -> str | None:
    """dpkg's status lines for `packages`; None without dpkg (not Debian or Ubuntu)."""
    if shutil.which("dpkg-query") is None:
        return None
    # Exit status 1 only says some names are unknown to dpkg: they are simply missing.
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${db:Status-Abbrev}\\n", *packages],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout


def apt_install(packages: Sequence[str]) -> int:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        code = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=False).returncode
        if code != 0:
            print(f"{' '.join(cmd)} failed (exit {code})", file=sys.stderr)
            return code
    return 0


def main(
    argv: Sequence[str],
    *,
    query: Callable[[Sequence[str]], str | None] = dpkg_query,
    is_root: Callable[[], bool] = lambda: os.geteuid() == 0,
    install: Callable[[Sequence[str]], int] = apt_install,
    has_command: Callable[[str], bool] = lambda name: shutil.which(name) is not None,
    list_text: str | None = None,
) -> int:
    if len(argv) < 2 or argv[0] not in ("ensure", "list"):
        print("usage: system_packages.py ensure|list GROUP...", file=sys.stderr)
        return 2
    try:
        text = LIST.read_text(encoding="utf-8") if list_text is None else list_text
        reqs = select(parse_list(text), argv[1:])
    except (OSError, ListError) as exc:
        print(f"{LIST.name}: {exc}", file=sys.stderr)
        return 2
    if argv[0] == "list":
        print(" ".join(dict.fromkeys(r.package for r in reqs)))
        return 0
    status = query([r.package for r in reqs])
    if status is None:
        return 0
    lacking = missing(reqs, installed_from_dpkg(status), has_command)
    if not lacking:
        return 0
    if is_root():
        print(f"installing Debian packages: {' '.join(lacking)}", file=sys.stderr)
        return install(lacking)
    print(advice(lacking), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
