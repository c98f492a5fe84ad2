"""A TCP proxy on 127.0.0.1 in front of an HTTP server, for outage tests.

    with FaultProxy(upstream_port) as proxy:    # proxy.endpoint_url → http://127.0.0.1:<port>
        proxy.refuse()                          # the port is closed: connections are refused
        proxy.slow_down()                       # every request is answered 503 SlowDown
        proxy.hang()                            # connections are accepted, requests never answered
        proxy.lose_answers()                    # requests reach the server, its answers are dropped
        proxy.forward()                         # back to normal
        proxy.forward(delay=0.01)               # forwarding, each chunk a client sends held 10 ms first
                                                # (open connections too)

``refuse`` also cuts the connections that are open (a client's keep-alive pool sees resets);
``slow_down`` reads each request (headers and body) and answers as S3 does when throttling;
``hang`` is a server frozen mid-flight (SIGSTOP): open connections stop being forwarded and new ones
are accepted and read, never answered, never closed. ``lose_answers`` is a network that fails
after the server acted: each request is forwarded, and the connection is cut when its answer comes.
"""

from __future__ import annotations

import socket
import threading
import time

from rftflow.infra.ports import free_port

SLOWDOWN = (b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s")
SLOWDOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                 b"<Message>Please reduce your request rate.</Message></Error>")


class FaultProxy:
    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.mode = "forward"
        self.delay = 0.0  # seconds each chunk from a client waits before it is passed on
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()

    # modes -----------------------------------------------------------------------------------
    def forward(self, delay: float = 0.0) -> None:
        self.delay = delay
        self._set("forward")

    def slow_down(self) -> None:
        self._set("slow_down")

    def refuse(self) -> None:
        self._set("refuse")

    def hang(self) -> None:
        self._set("hang")

    def lose_answers(self) -> None:
        self._set("lose_answers")

    def _set(self, mode: str) -> None:
        with self._lock:
            self.mode = mode
            if mode == "refuse":
                self._close_listener()
                for conn in list(self._open):
                    _close(conn)
                self._open.clear()
            elif self._listener is None:
                self._listen()

    # plumbing --------------------------------------------------------------------------------
    def __enter__(self) -> FaultProxy:
        with self._lock:
            self._listen()
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._close_listener()
            for conn in list(self._open):
                _close(conn)

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _close_listener(self) -> None:
        if self._listener is not None:
            _close(self._listener)
            self._listener = None

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed: refusing
                return
            with self._lock:
                mode = self.mode
                self._open.add(client)
            target = {"slow_down": self._slow_down, "hang": self._hang,
                      "lose_answers": self._lose_answer}.get(mode, self._forward)
            threading.Thread(target=target, args=(client,), daemon=True).start()

    def _upstream(self, client: socket.socket) -> socket.socket | None:
        """A connection to the server for ``client`` (None, ``client`` closed, when it refuses)."""
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            _close(client)
            return None
        with self._lock:
            self._open.add(upstream)
        return upstream

    def _forward(self, client: socket.socket) -> None:
        if (upstream := self._upstream(client)) is None:
            return
        threading.Thread(target=_pump, args=(upstream, client, False, self), daemon=True).start()
        _pump(client, upstream, True, self)

    def _lose_answer(self, client: socket.socket) -> None:
        if (upstream := self._upstream(client)) is None:
            return
        threading.Thread(target=_pump, args=(client, upstream, True, self), daemon=True).start()
        try:
            while (answer := upstream.recv(65536)).startswith(b"HTTP/1.1 100 "):
                client.sendall(answer)  # "100 Continue": the client sends its body
            # the server has acted and answers: the client never hears it
        except OSError:
            pass
        finally:
            _close(upstream)
            _close(client)

    def _hang(self, client: socket.socket) -> None:
        try:
            while client.recv(65536) and self.mode == "hang":
                pass
            while self.mode == "hang":  # the client gave up: keep its socket open, as a frozen server does
                time.sleep(0.1)
        except OSError:
            pass
        finally:
            _close(client)

    def _slow_down(self, client: socket.socket) -> None:
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = client.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, body = data.split(b"\r\n\r\n", 1)
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                chunk = client.recv(65536)
                if not chunk:
                    return
                body += chunk
            client.sendall(SLOWDOWN % (len(SLOWDOWN_BODY), SLOWDOWN_BODY))
        except OSError:
            pass
        finally:
            _close(client)


def _pump(source: socket.socket, sink: socket.socket, client_side: bool, proxy: FaultProxy) -> None:
    try:
        while chunk := source.recv(65536):
            if client_side and proxy.delay:  # read per chunk: a slow-down reaches open connections too
                time.sleep(proxy.delay)
            while proxy.mode == "hang":  # frozen: nothing more goes through
                time.sleep(0.1)
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
