"""How the coordinator stores secrets it must recognise later, never the secrets
themselves: bearer tokens (node and operator) as salted-by-purpose SHA-256, the admin
password as scrypt with a random salt.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets


def hash_token(token: str) -> str:
    # Tokens are long random strings, not guessable, so one fast hash suffices; the
    # prefix keeps these digests apart from any other SHA-256 of the same bytes.
    return hashlib.sha256(b"sangama-token/1\0" + token.encode()).hexdigest()


def hash_password(password: str, salt: bytes | None = None) -> str:
    # People choose passwords: a slow, salted hash.
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1)
    return f"scrypt${salt.hex()}${digest.hex()}"


def check_password(password: str, stored: str) -> bool:
    try:
        _, salt_hex, _digest_hex = stored.split("$")
    except ValueError:
        return False
    return hmac.compare_digest(hash_password(password, bytes.fromhex(salt_hex)), stored)
