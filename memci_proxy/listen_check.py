"""Whether a listen address is free, asked before a server binds it. Granian binds with SO_REUSEPORT: a second
server on a taken port would start without a word and share the connections with the first; a plain bind (without
that option) fails on a port some socket listens on, which is the question asked here."""

from __future__ import annotations

import socket


class PortInUse(Exception):
    """The address is taken: a clear message for the command line, which exits non-zero."""


def ensure_free(host: str, port: int, what: str) -> None:
    """Raise PortInUse when ``host:port`` cannot be bound (another process listens there)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise PortInUse(f"{what} cannot listen on {host}:{port}: {exc}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed connection's TIME_WAIT is no owner
        try:
            probe.bind(address)
        except OSError as exc:
            raise PortInUse(f"{what} cannot listen on {host}:{port}: {exc.strerror or exc} (another process "
                            "listens there: stop it or choose another port)") from None
