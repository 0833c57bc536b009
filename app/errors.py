"""Typed errors of the `app` package (worker, client, configuration)."""

from __future__ import annotations

from net.errors import ErrorCode


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

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(f"{error_code.name}: {message}")
        self.error_code = error_code
        """The wire's code, for decisions (reroute on STAGE_ERROR, ...)."""
        self.message = message

    @property
    def code(self) -> str:
        """The code's name ("OVERLOADED"), for logs and callers that match on text."""
        return self.error_code.name

    def __reduce__(self) -> tuple[type[StageFailed], tuple[ErrorCode, str]]:
        # Picklable despite the two-argument init (the default would pass only the text).
        return (StageFailed, (self.error_code, self.message))


class StageTimeout(ClientError):
    """No answer from the route within the step deadline."""
