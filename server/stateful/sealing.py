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
import errno
import hashlib
import logging
import os
import secrets
import stat
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from server.config import ConfigError
from server.errors import OpenAIError

log = logging.getLogger("switchyard_model.stateful")

KEY_FILE = "reasoning-seal.key"
_PREFIX = "sym2:"  # format version; a token without it is not ours
_AAD = b"switchyard-model reasoning v2"
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
    except (binascii.Error, ValueError):
        raise ConfigError("the reasoning seal key is not base64") from None
    if len(key) != 32:
        raise ConfigError(f"the reasoning seal key must be 32 bytes (base64 of 32 bytes), got {len(key)}")
    return key


def fingerprint(key: bytes) -> str:
    """What the state database keeps of the key, to notice a key file that went missing or changed."""
    return hashlib.sha256(b"switchyard-model seal key\0" + key).hexdigest()[:32]


def _read_key_file(path: Path) -> bytes | None:
    """The key file's key; None if absent. A link, a non-regular file, another owner's file or a
    file others may read is refused: a key anyone else could read or swap seals nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{path} is a symbolic link; the reasoning seal key must be a regular file") from None
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{path} is not a regular file")
        if info.st_uid != os.getuid():
            raise ConfigError(f"{path} belongs to another user (uid {info.st_uid})")
        if info.st_mode & 0o077:
            raise ConfigError(f"{path} may be read by others (mode {stat.S_IMODE(info.st_mode):o}); chmod 600 it")
        raw = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        return _decode_key(raw.decode("ascii"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path} does not hold a base64 key") from None


def load_key(setting: str | None, directory: str | Path, *, may_create: bool = True) -> bytes:
    """The key from the setting, else from `<directory>/reasoning-seal.key`, made (0600) if absent.

    `may_create=False` (the directory's state was sealed before): an absent file is an error, never
    replaced, since a new key would make every item sealed before unreadable. Several workers may
    start together: the file is written under a private name and linked into place, which fails for
    all but the first; the others read the winner's key.
    """
    if setting:
        return _decode_key(setting)
    directory = Path(directory)
    path = directory / KEY_FILE
    key = _read_key_file(path)
    if key is not None:
        return key
    if not may_create:
        raise ConfigError(
            f"{path} is missing, but this capture directory holds state sealed with it: restore the file "
            "(or set reasoning_seal_key); a new key would make every sealed reasoning item unreadable"
        )
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
    key = _read_key_file(path)
    if key is None:
        raise ConfigError(f"{path} vanished while it was being created")
    return key


class ReasoningSeal:
    """seal(text, owner) -> opaque string; open(token, param, owner) -> text, or a 400 naming the item.

    Each token is bound to the key (owner tag) of the call that sealed it and to the server run: it
    opens only for that key, in that run (the workers of one `serve` share a run).
    """

    def __init__(self, key: bytes, server_run: str = "") -> None:
        self._aead = AESGCM(key)
        self._run = server_run

    def _bound(self, owner: str) -> bytes:
        return b"\0".join((_AAD, owner.encode(), self._run.encode()))

    def seal(self, text: str, owner: str = "") -> str:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, text.encode("utf-8"), self._bound(owner))
        return _PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, token: object, param: str, owner: str = "") -> str:
        if not isinstance(token, str) or not token.startswith(_PREFIX):
            raise SealError(param, "it was not sealed by this server")
        try:
            raw = base64.urlsafe_b64decode(token[len(_PREFIX) :].encode())
        except (binascii.Error, ValueError):
            raise SealError(param, "it is not valid base64") from None
        if len(raw) <= _NONCE_BYTES:
            raise SealError(param, "it is truncated")
        try:
            plain = self._aead.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], self._bound(owner))
        except InvalidTag:
            raise SealError(
                param, "it was altered, sealed for another API key, or sealed by another server or server run"
            ) from None
        return plain.decode("utf-8")
