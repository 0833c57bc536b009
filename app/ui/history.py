"""Chat history on disk (no Qt): one JSON file per conversation under the user data dir."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from app.private_files import write_private

ROLES = ("user", "assistant")
MAX_NAME = 80


def default_history_dir() -> Path:
    return Path(platformdirs.user_data_dir("sangama")) / "chats"


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    created: float = field(default_factory=time.time)
    messages: list[tuple[str, str]] = field(default_factory=list)
    name: str = ""
    """Set by the person (Rename); empty: the title is the first question."""

    @property
    def title(self) -> str:
        if self.name.strip():
            return self.name.strip()
        first = next((text for role, text in self.messages if role == "user"), "")
        first = " ".join(first.split())
        return (first[:40] + "…") if len(first) > 40 else (first or "New conversation")

    def add(self, role: str, text: str) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        self.messages.append((role, text))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "created": self.created,
            "name": self.name,
            "messages": [{"role": r, "text": t} for r, t in self.messages],
        }

    @staticmethod
    def from_dict(doc: dict[str, Any]) -> Conversation:
        messages = [
            (str(m["role"]), str(m["text"])) for m in doc.get("messages", []) if m["role"] in ROLES
        ]
        name = doc.get("name", "")
        return Conversation(
            str(doc["id"]),
            float(doc.get("created", 0.0)),
            messages,
            name if isinstance(name, str) else "",
        )


class History:
    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or default_history_dir()

    def _path(self, conversation_id: str) -> Path:
        if not conversation_id.isalnum():
            raise ValueError(f"bad conversation id {conversation_id!r}")
        return self.directory / f"{conversation_id}.json"

    def save(self, conversation: Conversation) -> Path:
        path = self._path(conversation.id)
        # What the user said is theirs alone: 0600 files in a 0700 folder.
        write_private(path, json.dumps(conversation.to_dict(), indent=1))
        return path

    def load(self, conversation_id: str) -> Conversation:
        doc = json.loads(self._path(conversation_id).read_text(encoding="utf-8"))
        return Conversation.from_dict(doc)

    def list(self) -> list[Conversation]:
        """Every readable conversation, newest first."""
        if not self.directory.is_dir():
            return []
        found = []
        for p in self.directory.glob("*.json"):
            try:
                found.append(Conversation.from_dict(json.loads(p.read_text(encoding="utf-8"))))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return sorted(found, key=lambda c: c.created, reverse=True)

    def delete(self, conversation_id: str) -> None:
        self._path(conversation_id).unlink(missing_ok=True)

    def rename(self, conversation_id: str, name: str) -> Conversation:
        """Give a saved conversation a name of the person's choosing (blank: back to its
        first question); returns it as saved."""
        conversation = self.load(conversation_id)
        conversation.name = " ".join(name.split())[:MAX_NAME]
        self.save(conversation)
        return conversation
