"""The control secret: made by serve at start, read by the harness, never where the agent under test runs.

serve's control surface (marks, pinned decoding, the request log) answers only a request that carries the
run's secret in ``X-EU-Audit-Control``. Three things keep an agent that wants to relabel its own prompts
from using it:

1. **Where it lives.** By default serve writes it into a directory only this user can enter
   (``$XDG_RUNTIME_DIR/eu-audit/`` or ``/tmp/eu-audit-<uid>/``, mode 0700, checked to be ours), named by
   serve's port, and ``eu-audit gate`` finds it there from ``--serve``'s port. serve refuses a
   ``--control-file`` inside the directory it was started from: the README's recipe once started the
   agent from that same directory. The agent itself is run as another user (or in a container), so it
   cannot read the private directory either.
2. **What it proves.** Each mark carries the secret's key id, so the audit says which key marked the calls
   it counted as post-forget.
3. **Who used it.** Every control call names the harness's running number for it (``X-EU-Audit-Call``) and
   serve logs every control call, refused or not. A control call in the log that the harness never made is
   someone else holding the secret: ``eu_audit.blackbox.tamper`` reports it, and the gate fails. One serve
   serves one harness at a time for that reason.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import tempfile
import urllib.parse
from pathlib import Path

from eu_audit.errors import BadInput

CONTROL_HEADER = "X-EU-Audit-Control"
CALL_HEADER = "X-EU-Audit-Call"
#: serve's own routes, named once: serve's route table (``serve.app``) and the harness's client
#: (``blackbox.serve_control``) are both made from these
INFO_ROUTE = "/eu-audit/v1/info"  # the model, its digests, the control key's public id (open)
PROGRESS_ROUTE = "/eu-audit/v1/progress"  # requests answered so far (open)
MARK_ROUTE = "/eu-audit/v1/mark"  # which tenant and phase the calls that follow belong to (secret)
DECODING_ROUTE = "/eu-audit/v1/decoding"  # pinned decoding per lane (secret)
LOG_ROUTE = "/eu-audit/v1/log"  # the request log from an entry on, and its digest (secret)
#: every route of the control surface (a call to one of them is a control call, logged as such)
CONTROL_ENDPOINTS = (MARK_ROUTE, DECODING_ROUTE, LOG_ROUTE)


def new_secret() -> str:
    return secrets.token_hex(32)


def key_id(secret: str) -> str:
    """A public name for a secret (its digest's first 16 hex digits): logged and kept in the bundle."""
    return hashlib.sha256(secret.encode()).hexdigest()[:16]


def private_dir() -> Path:
    """A directory only this user can enter, made on first use: ``$XDG_RUNTIME_DIR/eu-audit`` (a per-user
    tmpfs on most Linux desktops), else ``<tmp>/eu-audit-<uid>``. Refused (exit 2) when it exists but is a
    link, another user's, or open to others: someone could have made it first to read what lands in it."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    base = Path(runtime) / "eu-audit" if runtime and Path(runtime).is_dir() else None
    folder = base or Path(tempfile.gettempdir()) / f"eu-audit-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        st = folder.lstat()
    except OSError as exc:
        raise BadInput(
            f"cannot make a private directory for serve's control secret ({exc.strerror})", path=str(folder)
        ) from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise BadInput("is not a directory (a link?); give --control-file elsewhere", path=str(folder))
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise BadInput(
            f"is not private to this user (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}; "
            "expected yours and 0700): someone else could read the secret there; remove it or give "
            "--control-file elsewhere",
            path=str(folder),
        )
    return folder


def default_control_file(port: int) -> Path:
    """Where serve on ``port`` writes its secret, and where ``eu-audit gate`` looks for it."""
    return private_dir() / f"serve-{port}.control"


def control_file_for(serve_url: str) -> Path:
    """The default control file of the serve at ``serve_url`` (its port names it)."""
    parts = urllib.parse.urlsplit(serve_url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise BadInput(f"--serve {serve_url}: not a URL with a valid port") from None
    return default_control_file(port)


def check_not_where_agents_start(path: Path, cwd: Path | None = None) -> None:
    """Refuse a control file inside the directory serve was started from (or under it), unless that place
    is this user's private directory: an agent started from the same directory, as a copied recipe does,
    could read it and relabel its own prompts."""
    here = (cwd or Path.cwd()).resolve()
    where = path.expanduser().resolve()
    if where.parent == private_dir().resolve():
        return
    if where.is_relative_to(here):
        raise BadInput(
            f"is inside the directory serve was started from ({here}); an agent started from there could "
            "read the control secret. Leave --control-file out (the default is a directory only you can "
            f"enter: {private_dir()}) or name a path outside it",
            path=str(path),
        )


def write_control_file(path: Path, secret: str) -> None:
    """The control secret for the harness: 0600, never through a symlink, replaced atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise BadInput("is not a regular file; give another --control-file", path=str(path))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.replace(tmp, path)


def read_control_file(path: Path) -> str:
    """The secret a serve wrote (exit 2 naming the file when it cannot be read)."""
    try:
        secret = path.read_text().strip()
    except OSError as exc:
        raise BadInput(
            f"cannot read serve's control secret ({exc.strerror}); serve writes it at start "
            "(--control-file), eu-audit gate reads it with --serve-control",
            path=str(path),
        ) from None
    if len(secret) < 32 or not secret.isalnum():
        raise BadInput("does not hold a control secret written by eu-audit serve", path=str(path))
    return secret
