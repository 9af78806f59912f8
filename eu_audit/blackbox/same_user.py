"""Whether the agent under test runs as the harness's own user: then it can read what only the harness
may (serve's control secret and log, in a directory only this user can enter), learn which tenant is the
reference from the marks, and steer its own floor. The threat model asks for another user or a container
(``docs/gate-your-agent.md``); this is how ``eu-audit gate`` checks it was given one.

On Linux the kernel says who owns a listening socket (``/proc/net/tcp`` and ``tcp6``, the ``uid``
column): the agent's port is looked up there. Elsewhere, or for a port this machine does not listen on (a
remote agent), it cannot be told, and the check says nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from eu_audit.errors import BadInput

LISTEN = "0A"  # the TCP state of a listening socket in /proc/net/tcp
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "")


def listening_socket(
    port: int, tables: tuple[Path, ...] = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
) -> tuple[int, int] | None:
    """(owner uid, socket inode) of the socket listening on ``port`` on this machine, None where it cannot
    be told."""
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                return int(cols[7]), int(cols[9])
    return None


def listening_uid(
    port: int, tables: tuple[Path, ...] = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
) -> int | None:
    """The uid that owns the socket listening on ``port`` on this machine, None where it cannot be told."""
    got = listening_socket(port, tables)
    return None if got is None else got[0]


def check_agent_user(agent: str, same_user_ok: bool) -> None:
    """Refuse (exit 2, with the fix) an agent on this machine that listens as the harness's own user,
    unless the operator accepts it (``--same-user-ok``, a test rig)."""
    if same_user_ok or "://" not in agent:
        return
    url = urlsplit(agent)
    if (url.hostname or "") not in LOCAL_HOSTS or url.port is None:
        return
    uid = listening_uid(url.port)
    if uid is not None and uid == os.getuid():
        raise BadInput(
            f"the agent at {agent} runs as your own user (uid {uid}): it can read serve's control secret and "
            "log, and so tell the reference tenant from the others. Run it as another user (sudo -u "
            "agent-under-test ...) or in a container; --same-user-ok accepts it (a test rig, not a gate)"
        )
