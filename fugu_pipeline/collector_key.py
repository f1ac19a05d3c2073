"""The collector's key: who wrote a cost-ledger line, so that a receipt's figures cannot be invented.

Every line the collector appends to the cost ledger (`ledger.py`) carries `key`, the fingerprint of
the collector's ed25519 public key, and `sig`, the ed25519 signature of the line's hash. The hash
covers the line's content and the previous line's hash, so a signature pins the line and its place
in the chain: a ledger written from scratch has no signature of a key the host trusts, and a line
edited after the fact (hashes recomputed or not) no longer matches its signature.

Where the private key comes from (the first that is set):

    $FUGU_COLLECTOR_KEY        base64 of the 32 raw private-key bytes (an environment variable or .env)
    $FUGU_COLLECTOR_KEY_FILE   a file holding that base64 text
    ~/.config/fugu-lite/collector.key   (or $XDG_CONFIG_HOME/fugu-lite/collector.key), made with mode
                               0600 the first time a ledger line is written

A key file the group or others may read is refused, with the `chmod 600` that fixes it.

It never reaches a ledger, a pack, a log or an exception: a line carries only the fingerprint.

A host trusts the public key of its own collector key and the keys it lists in
`models/promoted/collector_keys.json` (`fugu-lite collector-key --trust NAME PUBLIC_KEY`: a collector
on another machine of the host, or the host's own key before a rotation; `--rotate` keeps the old
public key there and makes a new private key; the collector keeps its older public keys in
`collector.key.retired.json`, so it goes on appending to a ledger its older key signed). A contest
refuses a ledger line that is unsigned, signed by a key it does not trust, or whose signature does
not verify (`ledger.read_entries`).
No torch, no dagster; `cryptography` is imported when a key is used.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from fugu_pipeline.settings import settings

KEY_ENV = "FUGU_COLLECTOR_KEY"
KEY_FILE_ENV = "FUGU_COLLECTOR_KEY_FILE"
TRUSTED_FILE = Path("promoted") / "collector_keys.json"


class CollectorKeyError(ValueError):
    """The collector key cannot be used (malformed, unreadable, not writable); says what to do."""


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str, what: str, size: int) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError, AttributeError):
        raise CollectorKeyError(f"{what} is not base64") from None
    if len(raw) != size:
        raise CollectorKeyError(f"{what} has {len(raw)} bytes, an ed25519 key has {size}")
    return raw


def fingerprint(public_key: str) -> str:
    """A short id of a collector's public key: what a ledger line carries in `key`."""
    return hashlib.sha256(_unb64(public_key, "the collector's public key", 32)).hexdigest()[:16]


@dataclass
class CollectorKey:
    """A loaded private key (never printed: its repr shows the fingerprint only)."""

    fingerprint: str
    public_key: str
    source: str
    _key: object = field(repr=False)
    retired: dict[str, str] = field(default_factory=dict)  # fingerprint -> public key of this collector's older keys

    def sign(self, line_hash: str) -> str:
        return _b64(self._key.sign(line_hash.encode("ascii")))


def _env_key() -> str:
    secret = settings().collector_key
    return secret.get_secret_value().strip() if secret else ""


def key_file() -> Path:
    """The key file: $FUGU_COLLECTOR_KEY_FILE, else the user's config folder."""
    named = settings().collector_key_file
    if named:
        return named.expanduser()
    base = os.environ.get("XDG_CONFIG_HOME", "").strip() or str(Path.home() / ".config")
    return Path(base) / "fugu-lite" / "collector.key"


def _from_text(text: str, source: str) -> CollectorKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.from_private_bytes(_unb64(text, source, 32))
    pub = _b64(key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
    return CollectorKey(fingerprint(pub), pub, source, key)


def new_private_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    raw = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                                     serialization.NoEncryption())
    return _b64(raw)


def _write_key_file(path: Path, text: str, *, replace: bool) -> None:
    """Write a key file with mode 0600 (fsynced, renamed into place; never over an existing one
    unless `replace`: two collectors starting at once keep the first key written)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (text + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
    finally:
        tmp.unlink(missing_ok=True)


def _require_private(path: Path) -> None:
    """Refuse a key file that the group or others can read or write: whoever reads it can sign
    ledger lines this host trusts (the file this code makes is 0600)."""
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:
        raise CollectorKeyError(f"{path}: the collector key is readable or writable by others (mode {mode:04o}); "
                                f"run: chmod 600 {shlex.quote(str(path))}")


def load_collector_key(*, create: bool = False) -> CollectorKey | None:
    """The host's collector key ($FUGU_COLLECTOR_KEY, else the key file); with `create`, a new key
    file when there is none. None when there is none and `create` is False."""
    from dotenv import load_dotenv

    load_dotenv(override=False)
    value = _env_key()
    if value:
        return _from_text(value, f"${KEY_ENV}")
    path = key_file()
    try:
        if not path.exists():
            if not create:
                return None
            _write_key_file(path, new_private_key(), replace=False)
        _require_private(path)
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CollectorKeyError(f"{path}: cannot read or make the collector key ({getattr(exc, 'strerror', None) or exc}); "
                                f"set ${KEY_ENV} or point ${KEY_FILE_ENV} at a writable file") from None
    key = _from_text(text, str(path))
    key.retired = _read_retired(path)
    return key


def retired_file(path: Path) -> Path:
    """The public keys of the collector's keys before its rotations (beside the key file)."""
    return path.with_name(path.name + ".retired.json")


def _read_retired(path: Path) -> dict[str, str]:
    p = retired_file(path)
    if not p.exists():
        return {}
    try:
        keys = json.loads(p.read_bytes())
        return {fingerprint(pub): pub for pub in keys.values()}
    except (OSError, ValueError, AttributeError, TypeError, CollectorKeyError) as exc:
        raise CollectorKeyError(f"{p}: not a list of retired collector keys ({str(exc)[:120]}); restore it") from None


def rotate_key_file() -> tuple[CollectorKey | None, CollectorKey]:
    """(the old key or None, the new key): a new private key in the key file; the old public key is
    kept in the retired file beside it (this collector keeps appending to a ledger it signed).
    Refused when the key comes from $FUGU_COLLECTOR_KEY (set a new value there instead)."""
    if _env_key():
        raise CollectorKeyError(f"the collector key comes from ${KEY_ENV}: trust its public key (fugu-lite "
                                f"collector-key --trust), then set a new value there")
    old = load_collector_key(create=False)
    path = key_file()
    if old is not None:
        keys = {**old.retired, old.fingerprint: old.public_key}
        retired_file(path).write_text(json.dumps(keys, indent=2, sort_keys=True) + "\n", encoding="ascii")
    _write_key_file(path, new_private_key(), replace=True)
    return old, load_collector_key(create=False)


# --------------------------------------------------------------------------- what a host trusts


def trusted_path(models_dir: str | Path) -> Path:
    return Path(models_dir) / TRUSTED_FILE


def read_trusted(models_dir: str | Path) -> dict[str, dict]:
    """name -> {"public_key", "added_at"} from the host's collector_keys.json (empty when absent)."""
    p = trusted_path(models_dir)
    if not p.exists():
        return {}
    try:
        keys = json.loads(p.read_bytes())["keys"]
        for name, k in keys.items():
            fingerprint(k["public_key"])
        return keys
    except (OSError, ValueError, KeyError, TypeError, AttributeError, CollectorKeyError) as exc:
        raise CollectorKeyError(f"{p}: not a collector keys file ({str(exc)[:160]}); restore it") from None


def trusted_keys(models_dir: str | Path | None) -> dict[str, str]:
    """fingerprint -> public key of every collector key the host trusts: its own (when it has one)
    and those in `models_dir`'s collector_keys.json."""
    out = {fingerprint(k["public_key"]): k["public_key"] for k in (read_trusted(models_dir) if models_dir else {}).values()}
    own = load_collector_key(create=False)
    if own is not None:
        out[own.fingerprint] = own.public_key
    return out


def trust_key(models_dir: str | Path, name: str, public_key: str) -> dict[str, dict]:
    """Add (or replace) a collector public key under `name` in the host's collector_keys.json."""
    name = name.strip()
    if not name or len(name) > 64 or not all(c.isalnum() or c in "-_." for c in name):
        raise CollectorKeyError(f"key name {name!r}: use letters, digits, '-', '_' or '.' (at most 64)")
    fingerprint(public_key)
    keys = read_trusted(models_dir)
    keys[name] = {"public_key": public_key.strip(), "added_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    p = trusted_path(models_dir)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"keys": keys}, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, p)
    return keys


class LineVerifier:
    """Checks a ledger line's collector signature against the trusted keys (public-key objects cached)."""

    def __init__(self, trusted: dict[str, str]):
        self.trusted = trusted
        self._pub: dict[str, object] = {}

    def problem(self, key: str, line_hash: str, sig: str) -> str | None:
        """Why the line's signature is not one of a trusted collector (None when it is)."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        if not key or not sig:
            return ("not signed by a collector (written without a collector key, or by hand): a contest takes only "
                    "lines its collectors signed")
        if key not in self.trusted:
            return (f"signed by collector key {key}, which this host does not trust (fugu-lite collector-key --trust "
                    "NAME PUBLIC_KEY adds one)")
        if key not in self._pub:
            self._pub[key] = Ed25519PublicKey.from_public_bytes(_unb64(self.trusted[key], "a trusted collector key", 32))
        try:
            self._pub[key].verify(_unb64(sig, "its signature", 64), line_hash.encode("ascii"))
        except (InvalidSignature, CollectorKeyError, UnicodeEncodeError):
            return f"its signature by collector key {key} does not verify (the line was edited or forged after it was written)"
        return None
