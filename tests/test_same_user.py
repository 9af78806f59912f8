"""An agent that runs as the harness's own user can read serve's control secret and log, and so tell the
reference tenant from the others: ``record --agent`` asks the kernel who owns the agent's listening
socket and refuses that agent (exit 2, with the fix), unless the operator says it is a test rig."""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from eu_audit.blackbox.same_user import listening_uid

from .helpers import run_cli

TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:2328 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 1 1
   1: 0100007F:2329 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1
"""


def test_the_uid_of_a_listening_socket_is_read_from_the_kernels_table(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    table.write_text(TCP)
    assert listening_uid(9000, (table,)) == 1001  # 0x2328, listening (0A)
    assert listening_uid(9001, (table,)) is None  # an established connection is no listener
    assert listening_uid(9000, (tmp_path / "absent",)) is None  # cannot be told: says nothing


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="the kernel's socket table is Linux's")
def test_an_agent_listening_as_the_harnesss_own_user_is_refused_unless_it_is_a_test_rig(
    tmp_path: Path,
) -> None:
    class Quiet(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        assert listening_uid(httpd.server_address[1]) == os.getuid()
        refused = run_cli("record", "--agent", url, "-o", str(tmp_path / "bb.jsonl"))
        said = " ".join(refused.stderr.split())
        assert refused.returncode == 2 and "runs as your own user" in said and "sudo -u" in said
        rig = run_cli("record", "--agent", url, "--same-user-ok", "-o", str(tmp_path / "bb.jsonl"))
        assert (
            "runs as your own user" not in rig.stderr
        )  # accepted: it goes on to the contract (and fails there)
    finally:
        httpd.shutdown()
