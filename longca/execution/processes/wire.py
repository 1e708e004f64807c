"""The socket protocol between a cell's client and the process that measures it (the warm worker,
``worker.py``, the resident GPU process, ``resident.py``, and the resident CP group,
``cp_resident.py``): a length-prefixed JSON message,
optionally carrying file descriptors (the cell's stderr and row file) over a Unix socket."""

from __future__ import annotations

import array
import json
import socket
import struct

_LEN = struct.Struct("!Q")


def send_msg(sock: socket.socket, payload: dict, fds: list[int] | None = None) -> None:
    """One message: its length, then its JSON; ``fds`` (open file descriptors) ride on the header."""
    body = json.dumps(payload, default=str).encode()
    header = _LEN.pack(len(body))
    if fds:
        sock.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(header)
    sock.sendall(body)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed the connection mid-message")
        buf += chunk
    return bytes(buf)


def recv_msg(sock: socket.socket, max_fds: int = 0) -> tuple[dict, list[int]]:
    """One message and the file descriptors that came with it (at most ``max_fds``)."""
    fds: list[int] = []
    if max_fds:
        header, fds, _, _ = socket.recv_fds(sock, _LEN.size, max_fds)
        if len(header) < _LEN.size:
            header += _recv_exact(sock, _LEN.size - len(header))
    else:
        header = _recv_exact(sock, _LEN.size)
    (n,) = _LEN.unpack(header)
    return json.loads(_recv_exact(sock, n)), fds
