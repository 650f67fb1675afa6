"""Free TCP ports on 127.0.0.1, chosen below the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket
from contextlib import ExitStack
from pathlib import Path

_FALLBACK_EPHEMERAL_START = 32768


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_START


def free_ports(count: int, low: int = 20000) -> list[int]:
    """`count` distinct ports that were bindable just now.

    Not port 0: the kernel hands out ports from the ephemeral range, which outgoing connections (many of
    them, from the apiserver's clients) also draw from, so a port reserved early - like the extender's,
    written into the scheduler config before the extender runs - could be taken before it is bound.
    """
    high = _ephemeral_start()
    candidates = random.sample(range(low, high), k=min(high - low, count * 20))
    chosen: list[int] = []
    with ExitStack() as held:  # keep each probe bound until all are picked, so the picks are distinct
        for port in candidates:
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"found only {len(chosen)} of {count} free ports in {low}..{high}")
