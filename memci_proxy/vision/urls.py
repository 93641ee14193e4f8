"""Which image URLs the vision model may be given.

A client's image may be a URL the vision model fetches itself. Unchecked, that makes the vision model a fetcher of
the proxy's neighbourhood: ``http://127.0.0.1:…``, ``http://[::1]/``, the cloud metadata address, a private
service, or ``file:///etc/passwd``. The describer therefore passes on only:

* ``data:`` URIs (the bytes themselves; blob references become such URIs once the tenant's ownership is checked);
* ``http(s)`` URLs whose host is public: an IP literal, or a name every resolved address of which is a public
  unicast address. Refused: loopback, private (RFC 1918, unique local, CGNAT), link-local, unspecified, multicast,
  reserved and IPv4-mapped or -translated forms of those, names that do not resolve, and every other scheme
  (``file:``, ``ftp:``, ``gopher:``…).

``allow_private`` (setting ``vision_allow_private_urls``) lifts the address check, for a vision model that is meant
to fetch from a private network; other schemes than http(s) and data stay refused. The check resolves the name
once: a vision model that resolves it again may get another answer (DNS rebinding); deployments that must rule
that out keep the vision model without network access to private ranges as well.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

Resolver = Callable[[str], Awaitable[list[str]]]
_NUMERIC = re.compile(r"[0-9a-fA-FxX.]+")
_AMBIGUOUS = re.compile(r"[\\\s\x00-\x1f\x7f]")


async def resolve_host(host: str) -> list[str]:
    """Every address ``host`` resolves to (empty when it does not resolve)."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return [str(info[4][0]) for info in infos]


def address_refusal(address: str) -> str | None:
    """Why an IP address is not public (None when it is)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return "not_an_address"
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is None and ip in ipaddress.ip_network("64:ff9b::/96"):  # NAT64: the IPv4 address at the end
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return address_refusal(str(embedded))
    if ip.is_loopback:
        return "loopback"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_link_local:
        return "link_local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_private or ip in ipaddress.ip_network("100.64.0.0/10"):
        return "private"
    if ip.is_reserved or not ip.is_global:
        return "reserved"
    return None


def _literal_address(host: str) -> str | None:
    """The address an IP literal names, in every spelling a fetcher's resolver accepts (``127.1``, ``0x7f.0.0.1``,
    ``2130706433``); None for a name."""
    try:
        return str(ipaddress.ip_address(host.split("%", 1)[0]))
    except ValueError:
        pass
    if _NUMERIC.fullmatch(host):
        try:
            return socket.inet_ntoa(socket.inet_aton(host))
        except OSError:
            return None
    return None


async def url_refusal(url: str, allow_private: bool = False, resolve: Resolver = resolve_host) -> str | None:
    """Why the vision model must not be given ``url`` (None: it may): a short reason for logs and metrics."""
    if url[:5].lower() == "data:":
        return None
    if _AMBIGUOUS.search(url):  # parsed differently by different URL parsers: never passed on
        return "malformed"
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
    except ValueError:
        return "malformed"
    if parts.scheme.lower() not in ("http", "https"):
        return "scheme"
    if not host:
        return "malformed"
    if allow_private:
        return None
    literal = _literal_address(host)
    addresses = [literal] if literal is not None else await resolve(host)
    if not addresses:
        return "unresolved"
    for address in addresses:
        why = address_refusal(address)
        if why is not None:
            return why
    return None
