"""`sangama chat --model NAME` as a joined client asks the swarm for that model's route
(its default without --model); along a route file --model stays the tokenizer's GGUF."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import app.cli.chat as chat
from app.cli.main import main

pytestmark = pytest.mark.unit


class _Asked(Exception):
    pass


@pytest.mark.parametrize(("flags", "model"), [([], "default"), (["--model", "tiny4"], "tiny4")])
def test_a_joined_client_names_the_swarms_model(
    flags: list[str], model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: dict[str, Any] = {}

    def connector(identity_dir: Path, coordinator: str | None = None, model: str = "") -> Any:
        asked.update(identity=identity_dir, model=model)

        async def connect() -> Any:
            raise _Asked

        return connect

    monkeypatch.setattr(chat, "identity_connector", connector)
    argv = ["chat", "--identity", str(tmp_path), "--prompt", "Hello", *flags]
    with pytest.raises(_Asked):
        main(argv)
    assert asked == {"identity": tmp_path, "model": model}
