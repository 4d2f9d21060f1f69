"""One HTTP client with one deadline over connecting, sending and every read.

`post` sends a request and reads its whole answer before a deadline (time.monotonic()) that bounds
the call, not each step of it: a plain socket timeout restarts at every receive, so a server that
trickles its answer a byte at a time would hold the caller forever. Reward servers
(rewards/sources.py) and vLLM servers (sampling/vllm.py) are reached through it.
"""

from __future__ import annotations

import base64
import http.client
import io
import socket
import time
import urllib.parse
import urllib.request


def post(url: str, body: bytes, deadline: float) -> tuple[int, str, bytes]:
    """POST `body` (JSON) to `url`: (status, reason, the answer's body), every step within
    `deadline` (time.monotonic(); TimeoutError past it), so a server that answers nothing or
    trickles its answer ends the call there. The environment's proxy (http_proxy, https_proxy,
    no_proxy) is used as urllib would; a name lookup keeps the system resolver's own timeouts."""
    parts = urllib.parse.urlsplit(url)
    https = parts.scheme == "https"
    kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
    target, headers = parts.path or "/", {"Content-Type": "application/json"}
    if parts.query:
        target += f"?{parts.query}"
    proxy = _proxy(parts)
    if proxy is None:
        connection = kind(parts.hostname, parts.port, timeout=_left(deadline))
    else:
        connection = kind(proxy.hostname, proxy.port, timeout=_left(deadline))
        auth = _proxy_auth(proxy)
        if https:        # a tunnel through the proxy (CONNECT), then TLS with the server
            connection.set_tunnel(parts.hostname, parts.port, headers=auth)
        else:            # the proxy is asked for the whole address
            target = url
            headers.update(auth)
    connection.connect()           # the socket's timeout bounds the connect (and TLS handshake)
    sock = connection.sock
    try:
        connection.sock = _DeadlineSocket(sock, deadline)
        connection.request("POST", target, body=body, headers=headers)
        response = connection.getresponse()
        chunks = []
        while chunk := response.read(1 << 16):   # each read re-armed with the time left
            chunks.append(chunk)
        return response.status, response.reason, b"".join(chunks)
    finally:
        connection.close()
        sock.close()


def _left(deadline: float) -> float:
    """Seconds until `deadline`; TimeoutError when none are left."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline has passed")
    return left


class _DeadlineSocket:
    """A connected socket whose every send and receive waits at most until `deadline` (a plain
    socket timeout restarts at each receive, and http.client reads the status line, each header
    line and the body through many)."""

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline

    def sendall(self, data) -> None:
        self.sock.settimeout(_left(self.deadline))
        self.sock.sendall(data)

    def recv_into(self, buffer, nbytes: int = 0) -> int:
        self.sock.settimeout(_left(self.deadline))
        return self.sock.recv_into(buffer, nbytes)

    def makefile(self, mode: str = "rb", buffering: int | None = None):
        return io.BufferedReader(_Reader(self))

    def close(self) -> None:
        """Nothing: http.client closes its connection while the answer is still being read; the
        socket is closed once the exchange is over."""

    def __getattr__(self, name):
        return getattr(self.sock, name)


class _Reader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket):
        self.sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self.sock.recv_into(buffer)


def _proxy(parts: urllib.parse.SplitResult) -> urllib.parse.SplitResult | None:
    """The proxy the environment names for this address, as urllib.request.urlopen picks it."""
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.netloc):
        return None
    return urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")


def _proxy_auth(proxy: urllib.parse.SplitResult) -> dict[str, str]:
    if not proxy.username:
        return {}
    user = urllib.parse.unquote(proxy.username) + ":" + urllib.parse.unquote(proxy.password or "")
    return {"Proxy-Authorization": "Basic " + base64.b64encode(user.encode()).decode()}
