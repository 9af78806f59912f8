"""Files the agent writes and does not declare: found, read, and named in every output.

An agent names the files it keeps a tenant in (``files``, or ``eu-audit gate --store-path``); a cache it
forgot to list (embeddings in a ``.npy``, the texts in a ``.pkl``, a log) would otherwise be read by no
one and said nowhere. On Linux the kernel says which processes hold the agent's listening socket
(``/proc/net/tcp``'s inode, then ``/proc/PID/fd``); for those processes and their children eu-audit looks
at:

- every regular file they hold open (a store kept open, a log appended to), but their standard streams
  (where whoever started the agent sends its output);
- every file written while the tenant ran (from its first call to this look), owned by the agent's user,
  under each folder holding a file it declared (a cache beside the store it did name) and under their
  working directory when the agent runs as another user, as a gate does (as the harness's own user, a
  test rig, that folder holds the operator's edits too). Folders of installed code (``.venv``,
  ``site-packages``, ``.git``, ``node_modules``, ``__pycache__``) are not walked, and at most
  ``MAX_WALKED`` entries are looked at.

Tenants are driven one after another by default, so a file written in one tenant's window is that tenant's
doing; tenants driven side by side may find each other's files, and a file more than one tenant's look
lists is shared (``forensics.attach_disks``: only rows that name the tenant count there).

A file the agent declared, a database's ``-wal``/``-journal``/``-shm`` beside it, or a path of the
harness's own (the bundle and its state, ``exclude``) is not "undeclared". What is found is read by
``forensics.read_files`` with the declared files, and listed as undeclared wherever the files read are
listed. Elsewhere (another OS, an agent on another machine, an agent in the harness's own process) nothing
can be told, and ``limits`` says the look was not made.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from eu_audit.blackbox.same_user import LOCAL_HOSTS, listening_socket

#: the most directory entries the working-directory walk looks at, per look
MAX_WALKED = 20_000
#: folders of installed code and tools' caches: never the agent's data
NOT_WALKED = frozenset(
    {".git", ".venv", "venv", "site-packages", "node_modules", "__pycache__", ".cache"}
    | {".pytest_cache", ".mypy_cache", ".ruff_cache"}
)
#: places that are not files an agent keeps data in
NOT_FILES = ("/proc/", "/sys/", "/dev/")
SIDECARS = ("-wal", "-journal", "-shm")


def _fds(pid: int, streams: bool = True) -> list[str]:
    """What the process's open file descriptors point at; without ``streams``, less 0, 1 and 2 (its
    standard streams: where whoever started it sends its output, not a store of its own)."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    out = []
    for n in names:
        if not streams and n in ("0", "1", "2"):
            continue
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{n}"))
        except OSError:
            continue
    return out


def _streams(pids: set[int]) -> set[str]:
    """The files the processes' standard streams (0, 1, 2) are redirected to."""
    out = set()
    for pid in pids:
        for n in ("0", "1", "2"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{n}")
                if target.startswith("/"):
                    out.add(os.path.realpath(target))
    return out


def _children(pids: set[int]) -> set[int]:
    """``pids`` and every process descended from them (an agent's workers)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found = set(pids)
    grew = True
    while grew:
        more = {p for p, pp in parent.items() if pp in found and p not in found}
        found |= more
        grew = bool(more)
    return found


def agent_processes(agent: str) -> tuple[set[int], int] | None:
    """(the processes serving ``agent``'s URL on this machine with their children, their uid), or None
    where that cannot be told (not an HTTP agent on this machine, not Linux, the socket not found)."""
    if "://" not in agent:
        return None
    url = urlsplit(agent)
    if (url.hostname or "") not in LOCAL_HOSTS or url.port is None or not Path("/proc/net/tcp").exists():
        return None
    got = listening_socket(url.port)
    if got is None:
        return None
    uid, inode = got
    holders = {int(e) for e in os.listdir("/proc") if e.isdigit() and f"socket:[{inode}]" in _fds(int(e))}
    holders.discard(os.getpid())
    return (_children(holders), uid) if holders else None


@dataclass
class UndeclaredFiles:
    """The look for undeclared files over one run: the agent's processes, its user, when the run began,
    and the harness's own paths."""

    pids: set[int]
    uid: int
    exclude: tuple[str, ...] = ()

    @classmethod
    def of(cls, agent: str, exclude: tuple[str, ...] = ()) -> UndeclaredFiles | None:
        found = agent_processes(agent)
        return None if found is None else cls(found[0], found[1], exclude=exclude)

    def _mine(self, path: str, declared: tuple[str, ...]) -> bool:
        """Whether ``path`` is declared (or beside or under a declared path) or the harness's own."""
        bare = next((path[: -len(s)] for s in SIDECARS if path.endswith(s)), path)
        return any(bare == d or path.startswith(d.rstrip("/") + "/") for d in declared) or any(
            path.startswith(x) for x in self.exclude
        )

    def _walk(self, root: str, out: dict[str, None], declared: tuple[str, ...], since: float) -> None:
        seen = 0
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in NOT_WALKED and not d.endswith(".dist-info")]
            for name in files:
                seen += 1
                if seen > MAX_WALKED:
                    return
                path = os.path.join(folder, name)
                try:
                    st = os.stat(path, follow_symlinks=False)
                except OSError:
                    continue
                if st.st_uid == self.uid and st.st_mtime >= since and not self._mine(path, declared):
                    out[path] = None

    def find(self, declared: list[str], since: float) -> list[str]:
        """The files the agent's processes hold open or wrote since ``since`` (the tenant's first call)
        under their working directory or beside a declared file, less the declared ones and the
        harness's own."""
        named = tuple(os.path.realpath(d) for d in declared)
        known = named + tuple(sorted(_streams(self.pids)))  # its output redirected to a file is not a store
        out: dict[str, None] = {}
        roots = {os.path.dirname(d) for d in named}
        for pid in sorted(self.pids):
            for target in _fds(pid, streams=False):
                if target.startswith("/") and not target.startswith(NOT_FILES) and os.path.isfile(target):
                    real = os.path.realpath(target)
                    try:  # a library or a model it reads is not data: only what it wrote since
                        fresh = os.stat(real).st_mtime >= since
                    except OSError:
                        continue
                    if fresh and not self._mine(real, known):
                        out[real] = None
            if self.uid != os.getuid():  # as the harness's own user, its cwd holds the operator's edits too
                with contextlib.suppress(OSError):
                    roots.add(os.path.realpath(f"/proc/{pid}/cwd"))
        for root in sorted(roots - {"/", ""}):
            self._walk(root, out, known, since)
        return sorted(out)
