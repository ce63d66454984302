"""A free TCP port: the one helper every server, rendezvous and test of llmrl asks for one."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing is bound to on ``host`` right now (the OS picks it; ``""``: every interface, for a
    rendezvous other hosts reach)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
