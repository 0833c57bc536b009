"""Typed errors of the lab's WAN emulator."""

from __future__ import annotations

from app.errors import AppError


class ProxyError(AppError):
    """The delay proxy was used in the wrong state (not started, already closed)."""
