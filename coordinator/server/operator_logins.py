"""Operator logins (the page's session cookie), kept in the coordinator's database so
they survive a restart. The API uses it like a set of tokens; only hashes are stored,
and a login lasts `LOGIN_HOURS` (signing in again starts a new one)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from coordinator.server.secret_hashes import hash_token
from coordinator.server.store import Store, utcnow

LOGIN_HOURS = 12


class OperatorLogins:
    def __init__(self, store_of: Callable[[], Store], hours: float = LOGIN_HOURS) -> None:
        # The store is looked up at each use, not at creation: an app is also built
        # without a running coordinator (for its OpenAPI description alone).
        self._store_of = store_of
        self.hours = hours

    @property
    def store(self) -> Store:
        return self._store_of()

    def add(self, token: str) -> None:
        self.store.add_login(hash_token(token), utcnow() + dt.timedelta(hours=self.hours))

    def discard(self, token: str) -> None:
        if token:
            self.store.drop_login(hash_token(token))

    def __contains__(self, token: object) -> bool:
        return isinstance(token, str) and bool(token) and self.store.login_valid(hash_token(token))
