"""Typed errors of the `app` package (worker, client, configuration)."""

from __future__ import annotations


class AppError(Exception):
    """Base of errors raised on purpose by `app`."""


class ConfigError(AppError):
    """A configuration file, route or command-line value is unusable."""


class ClientError(AppError):
    """A chat session could not run to the end."""


class RouteUnavailable(ClientError):
    """A stage of the route could not be reached or refused us."""


class StageFailed(ClientError):
    """A stage reported an error for our session (code and message from the wire)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class StageTimeout(ClientError):
    """No answer from the route within the step deadline."""
