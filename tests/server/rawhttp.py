"""HTTP/1.1 over a bare socket: the test decides the exact moment a client goes away."""

import json
import socket
import struct
import time


def address(base: str) -> tuple[str, int]:
    host, port = base.removeprefix("http://").split(":")
    return host, int(port)


def request_bytes(path: str, body: bytes, ctype: str = "application/json", extra: bytes = b""):
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\n"
    ).encode()
    return head + extra + b"\r\n" + body


def send(base: str, path: str, body: dict, timeout: float = 120.0) -> socket.socket:
    """Opens a connection and sends one JSON request; the caller reads or closes it."""
    sock = socket.create_connection(address(base), timeout=timeout)
    sock.sendall(request_bytes(path, json.dumps(body).encode()))
    return sock


def read_until(sock: socket.socket, marker: bytes, timeout: float = 120.0) -> bytes:
    """Reads until `marker` has arrived (or the peer closed); returns everything read."""
    data = b""
    deadline = time.monotonic() + timeout
    while marker not in data:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def disconnect(sock: socket.socket, *, reset: bool = False) -> None:
    """Close the connection: a FIN as a client that gives up sends, or a reset as from a
    killed process."""
    if reset:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
