"""Sealed reasoning: the raw reasoning text encrypted and authenticated with a server key.

With `include: ["reasoning.encrypted_content"]`, reasoning output items carry the reasoning sealed
(AES-256-GCM from the `cryptography` package), so a client that keeps no server state (Codex over
HTTP, `store: false`) can send it back and the model sees its own reasoning again. The client cannot
read a forged item into the model's mouth: anything not sealed by this key fails to open and the
call gets a 400. Every worker on one capture directory shares the key file, so any of them opens
what another sealed.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from server.errors import OpenAIError

log = logging.getLogger("switchyard_model.stateful")

KEY_FILE = "reasoning-seal.key"
_PREFIX = "sym1:"  # format version; a token without it is not ours
_AAD = b"switchyard-model reasoning v1"
_NONCE_BYTES = 12


class SealError(OpenAIError):
    def __init__(self, param: str, why: str) -> None:
        super().__init__(
            400,
            f"`{param}` cannot be opened: {why}. Send back reasoning items exactly as this server returned them.",
            param=param,
            code="invalid_encrypted_content",
        )


def _decode_key(text: str) -> bytes:
    try:
        key = base64.urlsafe_b64decode(text.strip().encode())
    except (binascii.Error, ValueError) as exc:
        raise ValueError("the reasoning seal key is not base64") from exc
    if len(key) != 32:
        raise ValueError(f"the reasoning seal key must be 32 bytes (base64 of 32 bytes), got {len(key)}")
    return key


def load_key(setting: str | None, directory: str | Path) -> bytes:
    """The key from the setting, else from `<directory>/reasoning-seal.key`, made (0600) if absent.

    Several workers may start together: the file is written under a private name and linked into
    place, which fails for all but the first; the others read the winner's key.
    """
    if setting:
        return _decode_key(setting)
    directory = Path(directory)
    path = directory / KEY_FILE
    try:
        return _decode_key(path.read_text())
    except FileNotFoundError:
        pass
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = directory / f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(base64.urlsafe_b64encode(AESGCM.generate_key(bit_length=256)).decode())
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
            log.info("generated a reasoning seal key at %s", path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    return _decode_key(path.read_text())


class ReasoningSeal:
    """seal(text) -> opaque string; open(token, param) -> text, or a 400 naming the item."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, text: str) -> str:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, text.encode("utf-8"), _AAD)
        return _PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, token: object, param: str) -> str:
        if not isinstance(token, str) or not token.startswith(_PREFIX):
            raise SealError(param, "it was not sealed by this server")
        try:
            raw = base64.urlsafe_b64decode(token[len(_PREFIX) :].encode())
        except (binascii.Error, ValueError):
            raise SealError(param, "it is not valid base64") from None
        if len(raw) <= _NONCE_BYTES:
            raise SealError(param, "it is truncated")
        try:
            plain = self._aead.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _AAD)
        except InvalidTag:
            raise SealError(param, "it was altered, or sealed by another server's key") from None
        return plain.decode("utf-8")
