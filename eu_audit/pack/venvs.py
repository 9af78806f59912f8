"""A venv per pinned release: each pack case's release runs its agent in a virtual environment of its own
(the stack's pins clash from case to case and with eu-audit's), made once and reused, keyed by the
Python and the exact pins. A venv is ready only once its install finished (``READY``); a half-made one is
made again. Only PyPI is reached (``pip install``), never a git URL."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from eu_audit.errors import RunFailed

#: written into a venv once every pin installed; holds ``pip freeze``
READY = "eu-audit-ready.txt"
INSTALL_S = 900  # one release's install: a stack with its model libraries, from a cold pip cache


def venvs_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eu-audit" / "pack-venvs"


def venv_key(python: str, pins: Sequence[str]) -> str:
    text = "\n".join([python, *sorted(pins)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # two pack runs never build the same venv at once
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def venv_for(pins: Sequence[str], python: str = "", *, log: Path | None = None) -> Path:
    """The venv holding exactly ``pins`` for ``python`` (default: this interpreter), made if missing.
    Returns its Python. A failed install is a failed run (exit 3) naming the pin list and the log."""
    python = python or sys.executable
    if not Path(python).is_file():
        raise RunFailed(f"the case's Python does not exist: {python}")
    folder = venvs_root() / venv_key(python, pins)
    with _locked(folder.with_suffix(".lock")):
        if (folder / READY).is_file():
            return folder / "bin" / "python"
        shutil.rmtree(folder, ignore_errors=True)
        out = open(log, "a") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
        try:
            subprocess.run([python, "-m", "venv", str(folder)], check=True, stdout=out, stderr=out)
            pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "--quiet"]
            pip.append("--disable-pip-version-check")
            got = subprocess.run([*pip, *pins], stdout=out, stderr=out, timeout=INSTALL_S)
            if got.returncode != 0:
                raise RunFailed(
                    f"could not install {' '.join(pins)} (pip exit {got.returncode})"
                    + (f"; its output: {log}" if log is not None else "")
                )
            freeze = subprocess.run(
                [str(folder / "bin" / "python"), "-m", "pip", "freeze"], capture_output=True, text=True
            )
            (folder / READY).write_text(freeze.stdout)
        except subprocess.SubprocessError as exc:
            raise RunFailed(f"could not make a venv for {' '.join(pins)}: {exc}") from None
        finally:
            if log is not None:
                out.close()  # type: ignore[union-attr]
    return folder / "bin" / "python"


def installed(python: Path) -> dict[str, str]:
    """What a ready venv holds (name -> version, from its ``pip freeze``)."""
    text = (python.parent.parent / READY).read_text()
    out = {}
    for line in text.splitlines():
        name, sep, version = line.partition("==")
        if sep:
            out[name.lower().replace("_", "-")] = version
    return out
