"""What lets a file the tools keep in an image folder (the decode cache) vouch that this machine made
it: a secret kept outside every image folder, made once per user, and HMAC-SHA256 seals of what such
a file says about itself. A folder from someone else may come with its files, in any state; without
this machine's secret their seals do not hold, and they are made again rather than trusted.

The secret is <config>/secret: $MTLC_CONFIG_DIR, else $XDG_CONFIG_HOME/mtlc, else ~/.config/mtlc;
32 random bytes, readable by its owner only. Where it can be neither read nor made (a read-only home),
each run uses a secret of its own: caches still work within the run, and are made again by the next.
"""
import functools
import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

from ..errors import UserError
from .opening import open_kept

SECRET_NAME = "secret"
SECRET_BYTES = 32


def config_dir():
    """Where the secret is kept."""
    if os.environ.get("MTLC_CONFIG_DIR"):
        return Path(os.environ["MTLC_CONFIG_DIR"])
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "mtlc"


def read_or_make(path):
    """The secret in `path`, made there first if there is none (created exclusively, mode 0600, never
    through a link)."""
    try:
        fd = open_kept(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "secret", 0o600, writing=True)
    except FileExistsError:
        fd = open_kept(path, os.O_RDONLY, "secret")
        with open(fd, "rb") as f:
            value = f.read()
        if len(value) != SECRET_BYTES:
            raise UserError(f"{path} is not a secret this project made ({len(value)} bytes, not {SECRET_BYTES}): "
                            f"remove it (caches made with it are then made again)")
        return value
    value = secrets.token_bytes(SECRET_BYTES)
    with open(fd, "wb") as f:
        f.write(value)
        f.flush()
        os.fsync(f.fileno())
    return value


@functools.cache
def secret():
    """(this user's secret, None) or, where it can be neither read nor made, (a secret of this run's
    own, why)."""
    path = config_dir() / SECRET_NAME
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return read_or_make(path), None
    except OSError as exc:
        return secrets.token_bytes(SECRET_BYTES), f"cannot keep a secret in {path} ({exc.strerror or exc})"


def seal(value):
    """The HMAC-SHA256 (hex) of a JSON-able value under this user's secret."""
    return hmac.new(secret()[0], json.dumps(value, sort_keys=True).encode("utf-8", "surrogateescape"),
                    hashlib.sha256).hexdigest()


def holds(value, tag):
    """Whether tag is the seal of value (compared in constant time)."""
    return isinstance(tag, str) and hmac.compare_digest(seal(value), tag)
