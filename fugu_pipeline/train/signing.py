"""Signed packs: who submits a head is a key, not a name in a file.

A submitter makes a key pair once (`fugu-lite keygen`): the private key goes into the
environment (`FUGU_SIGNING_KEY`, base64 of the 32 raw ed25519 bytes; never written to disk by this
code, never logged), the public key to the host. `fugu-lite pack` signs the pack: `signature.json`
holds the sha256 of every pack file (weights, manifest, receipt, contract, ledger), the public key
and an ed25519 signature over both (`cryptography`'s Ed25519).

A host keeps the public keys it accepts in `models/promoted/keys.json` (`fugu-lite accept-key
NAME PUBLIC_KEY`), each under a name. `preflight` and `validate` refuse an unsigned pack, a file
that is not the one signed, a signature that does not verify, and a key the host does not hold.
The rate limit counts attempts per key: renaming the receipt's `submitter` changes nothing (and
breaks the signature).

Verification reads the members last, and by streaming: `signature.json` (at most 1 MiB) is parsed,
its ed25519 signature over the listed digests is checked and its key looked up first, so a forged
or unknown signature is refused without reading a member; then every member's size is checked
against a cap per member and a cap for the whole pack (`MAX_MEMBER_BYTES`, `MAX_PACK_BYTES`; a
host sets them as `pack_member_max_bytes` / `pack_total_max_bytes` in its promotion policy's
gates) before any byte of it is read, and each is hashed in 1 MiB chunks.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from fugu_pipeline.files import FileTooLargeError, atomic_write, stream_file
from fugu_pipeline.hashing import canonical_json
from fugu_pipeline.settings import settings

SIGNATURE_FILE = "signature.json"
SIGNATURE_FORMAT = "fugu-pack-signature/1"
KEY_ENV = "FUGU_SIGNING_KEY"
KEYS_FILE = Path("promoted") / "keys.json"
MAX_MEMBER_BYTES = 512 * 2**20  # a pack member (the weights, the ledger...) of more is refused unread
MAX_PACK_BYTES = 1024 * 2**20  # all members together
MAX_SIGNATURE_BYTES = 2**20


class SigningError(ValueError):
    """A signing key or a signature cannot be used; the message says which and what to do."""


class MemberMismatch(SigningError):
    """The signature verifies with a key the host accepts, but a member is missing, added or changed
    after signing (its members were within the caps: a caller may go on reading them to say more)."""


class PackSignature(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: str = SIGNATURE_FORMAT
    public_key: str = Field(description="base64 of the 32 raw ed25519 public-key bytes")
    files: dict[str, str] = Field(description="file name -> sha256 of its bytes")
    signed_at: str = ""
    signature: str = Field(description="base64 ed25519 signature over the canonical JSON of format, public_key, files")

    def message(self) -> bytes:
        return canonical_json({"format": self.format, "public_key": self.public_key, "files": self.files}).encode()


class AcceptedKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    public_key: str
    added_at: str = ""


class AcceptedKeys(BaseModel):
    """The host's keys: name -> public key (`models/promoted/keys.json`)."""

    model_config = ConfigDict(extra="forbid")

    keys: dict[str, AcceptedKey] = Field(default_factory=dict)

    def name_of(self, public_key: str) -> str | None:
        return next((n for n, k in self.keys.items() if k.public_key == public_key), None)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str, what: str, size: int | None = None) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError, AttributeError):
        raise SigningError(f"{what} is not base64") from None
    if size is not None and len(raw) != size:
        raise SigningError(f"{what} has {len(raw)} bytes, an ed25519 key has {size}")
    return raw


def fingerprint(public_key: str) -> str:
    """A short id of a public key (what the history records beside the key's name)."""
    return hashlib.sha256(_unb64(public_key, "the public key", 32)).hexdigest()[:16]


def new_key_pair() -> tuple[str, str]:
    """(private key, public key), both base64 of their 32 raw bytes."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    return _b64(raw), public_of(_b64(raw))


def public_of(private_key: str) -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.from_private_bytes(_unb64(private_key, f"${KEY_ENV}", 32))
    return _b64(key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def key_from_env() -> str:
    """The submitter's private key from the environment (a `.env` file counts), checked."""
    from dotenv import load_dotenv

    load_dotenv(override=False)
    secret = settings().signing_key
    value = secret.get_secret_value().strip() if secret else ""
    if not value:
        raise SigningError(f"no signing key: set ${KEY_ENV} (fugu-lite keygen makes one; keep it in the environment "
                           "or a .env file, never in the pack)")
    public_of(value)  # refuses a malformed key here, in one line
    return value


def file_digests(folder: Path, names: list[str], limit: int = 2**62) -> dict[str, str]:
    """sha256 of each file of `names` present in `folder`, streamed (at most `limit` bytes a file)."""
    out = {}
    for n in names:
        if (folder / n).is_file():
            h = hashlib.sha256()
            stream_file(folder / n, limit, h)
            out[n] = h.hexdigest()
    return out


def sign_pack(folder: str | Path, names: list[str], private_key: str) -> PackSignature:
    """Write `signature.json` over the files `names` of `folder` (all must be there)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    folder = Path(folder)
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise SigningError(f"{folder}: cannot sign, missing {', '.join(missing)}")
    key = Ed25519PrivateKey.from_private_bytes(_unb64(private_key, f"${KEY_ENV}", 32))
    sig = PackSignature(public_key=public_of(private_key), files=file_digests(folder, names),
                        signed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), signature="")
    sig.signature = _b64(key.sign(sig.message()))
    atomic_write(folder / SIGNATURE_FILE, json.dumps(sig.model_dump(mode="json"), indent=2) + "\n")
    return sig


def verify_pack(folder: str | Path, names: list[str], accepted: AcceptedKeys, *, member_cap: int = MAX_MEMBER_BYTES,
                total_cap: int = MAX_PACK_BYTES) -> tuple[str, str]:
    """(the key's name on this host, its fingerprint) when `folder` is signed over exactly these
    files by a key the host accepts; else SigningError (one line naming what is wrong). The
    signature and the key are checked before any member is read, the members' sizes against
    `member_cap` and `total_cap` before they are read, and then each is hashed by streaming."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    folder = Path(folder)
    path = folder / SIGNATURE_FILE
    if not path.is_file():
        raise SigningError(f"unsigned pack: no {SIGNATURE_FILE} (sign it: set ${KEY_ENV} and run fugu-lite pack)")
    try:
        raw = b""
        if path.stat().st_size <= MAX_SIGNATURE_BYTES:
            raw = path.read_bytes()[:MAX_SIGNATURE_BYTES + 1]
        if not raw or len(raw) > MAX_SIGNATURE_BYTES:
            raise ValueError(f"empty, or more than {MAX_SIGNATURE_BYTES:,} bytes")
        sig = PackSignature.model_validate_json(raw)
    except (OSError, ValueError) as exc:
        raise SigningError(f"{SIGNATURE_FILE} does not parse: {str(exc).splitlines()[0][:200]}") from None
    try:
        pub = Ed25519PublicKey.from_public_bytes(_unb64(sig.public_key, "the signature's public key", 32))
        pub.verify(_unb64(sig.signature, "the signature"), sig.message())
    except InvalidSignature:
        raise SigningError("the signature does not verify with its public key (forged or edited)") from None
    fp = fingerprint(sig.public_key)
    name = accepted.name_of(sig.public_key)
    if name is None:
        raise SigningError(f"signed by key {fp}, which this host does not accept (fugu-lite accept-key NAME KEY "
                           "adds a submitter's public key)")
    want = sorted(n for n in names if (folder / n).is_file())
    total = 0
    for n in want:
        size = (folder / n).stat().st_size
        total += size
        if size > member_cap:
            raise SigningError(f"{n}: {size:,} bytes, over the cap of {member_cap:,} bytes a pack member may hold "
                               "(pack_member_max_bytes): refused unread")
    if total > total_cap:
        raise SigningError(f"the pack's members hold {total:,} bytes, over the cap of {total_cap:,} bytes a pack may "
                           "hold (pack_total_max_bytes): refused unread")
    if sorted(sig.files) != want:
        raise MemberMismatch(f"{SIGNATURE_FILE} covers {sorted(sig.files)}, the pack holds {want}")
    changed = []
    for n in want:
        try:
            if file_digests(folder, [n], member_cap).get(n) != sig.files.get(n):
                changed.append(n)
        except FileTooLargeError as exc:
            raise SigningError(f"{n}: {str(exc).split(': ', 1)[-1]} (pack_member_max_bytes): refused") from None
    if changed:
        raise MemberMismatch(f"{', '.join(changed)} changed after signing (its sha256 is not the signed one)")
    return name, fp


def keys_path(models_dir: str | Path) -> Path:
    return Path(models_dir) / KEYS_FILE


def read_keys(models_dir: str | Path) -> AcceptedKeys:
    p = keys_path(models_dir)
    if not p.exists():
        return AcceptedKeys()
    try:
        return AcceptedKeys.model_validate_json(p.read_bytes())
    except ValueError as exc:
        raise SigningError(f"{p}: not a keys file ({str(exc).splitlines()[0][:200]}); restore it") from None


def accept_key(models_dir: str | Path, name: str, public_key: str) -> AcceptedKeys:
    """Add (or replace) `name`'s public key in the host's keys file."""
    name = name.strip()
    if not name or len(name) > 64 or not all(c.isalnum() or c in "-_." for c in name):
        raise SigningError(f"key name {name!r}: use letters, digits, '-', '_' or '.' (at most 64)")
    fingerprint(public_key)  # a malformed key is refused here
    keys = read_keys(models_dir)
    other = keys.name_of(public_key.strip())
    if other is not None and other != name:
        raise SigningError(f"this public key is already accepted as {other!r}: one key, one submitter")
    keys.keys[name] = AcceptedKey(public_key=public_key.strip(), added_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    p = keys_path(models_dir)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(p, json.dumps(keys.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
    return keys
