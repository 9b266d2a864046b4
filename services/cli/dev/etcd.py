"""The one-member etcd `ferry dev` runs for a failover topology, and the tests' too.

Owns: finding the etcd binary (Debian's etcd-server), its command line (127.0.0.1
only) and the health probe. Starting, waiting for and stopping the process is the
caller's (`services.cli.dev.run`, tests/etcd.py). Never imports ferry's services.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from pathlib import Path

ETCD_INSTALL = "apt-get install -y --no-install-recommends etcd-server"
# Debian's etcd-server installs it here; /usr/bin is not on every PATH (cron, some sudo).
DEBIAN_ETCD = "/usr/bin/etcd"


def find_etcd() -> str:
    """The etcd server binary: `etcd` on PATH, else Debian's /usr/bin/etcd.

    Raises:
        RuntimeError: etcd is not installed; the message says how to install it.
    """
    found = shutil.which("etcd")
    if found is None and os.access(DEBIAN_ETCD, os.X_OK):
        found = DEBIAN_ETCD
    if found is None:
        raise RuntimeError(
            "etcd is not installed (no `etcd` on PATH, no /usr/bin/etcd); broker failover "
            f"elects masters in it. Install it: sudo {ETCD_INSTALL}"
        )
    return found


def etcd_command(
    binary: str, name: str, data_dir: Path, client_port: int, peer_port: int
) -> list[str]:
    """A one-member etcd cluster on 127.0.0.1 only: the command line `ferry dev`
    and the tests' EtcdServer (tests/etcd.py) both run. Flags as etcd 3.4 and 3.5
    spell them; warnings and errors only, as JSON lines on stderr."""
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        binary,
        "--name", name,
        "--data-dir", str(data_dir),
        "--listen-client-urls", client,
        "--advertise-client-urls", client,
        "--listen-peer-urls", peer,
        "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"{name}={peer}",
        "--initial-cluster-state", "new",
        "--logger", "zap",
        "--log-outputs", "stderr",
        "--log-level", "warn",
    ]  # fmt: skip


def etcd_healthy(client_port: int, timeout_s: float = 1.0) -> bool:
    """Whether the etcd on 127.0.0.1:`client_port` answers GET /health with
    {"health": "true"} (it has a leader and serves requests)."""
    url = f"http://127.0.0.1:{client_port}/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return json.loads(response.read()).get("health") == "true"
    except (OSError, ValueError):  # refused, reset, timed out, HTTP 503, not JSON yet
        return False
