"""Address checks and free ports (upstream's `verl.utils.net_utils`)."""
from __future__ import annotations

import ipaddress
import socket

__all__ = ["is_ipv4", "is_ipv6", "is_valid_ipv6_address", "get_free_port"]


def is_ipv4(ip_str: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(ip_str), ipaddress.IPv4Address)
    except ValueError:
        return False


def is_ipv6(ip_str: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(ip_str), ipaddress.IPv6Address)
    except ValueError:
        return False


def is_valid_ipv6_address(address: str) -> bool:
    """An IPv6 address, with or without the [] a URL puts around it."""
    return is_ipv6(address[1:-1] if address.startswith("[") and address.endswith("]") else address)


def get_free_port(address: str, with_alive_sock: bool = False) -> tuple[int, socket.socket | None]:
    """A port free on `address`; with `with_alive_sock` the bound socket is returned open (the caller closes it
    when it takes the port) so no other process can take it meanwhile."""
    family = socket.AF_INET6 if is_valid_ipv6_address(address) else socket.AF_INET
    host = address.strip("[]")
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    if with_alive_sock:
        return port, sock
    sock.close()
    return port, None
