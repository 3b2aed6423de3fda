"""A TCP proxy the move tests put between a client and a PostgreSQL server, to break the network on cue.

Between pgidgen (or a subscription: --subscription-dsn) and a server, a FaultProxy forwards bytes both ways until
the test says otherwise:

- cut()                 every current connection closed at once, both sides (the server sees its client go, the
                        client "server closed the connection unexpectedly"); new ones are forwarded as before
- refuse(seconds)       cut(), and for that long new connections are closed the moment they are accepted
- stall(seconds)        nothing forwarded for that long (sockets stay open: a link that hangs, not one that drops)
- slow(seconds)         each block forwarded that much later (None: at full speed again)
- cut_after(pattern)    the next client block holding pattern is forwarded, then every connection is cut: the
                        server gets the statement (a COMMIT, say), the client never hears how it ended

Plain threads and sockets, no dependencies: a thread accepts, two threads per connection pump. `events` records
what happened with times (perf_counter), so a test can say how long a move took to ride through a fault.
"""
from __future__ import annotations

import socket
import threading
import time

import psycopg

_BLOCK = 1 << 16


class _Pair:
    """One client connection and its server connection."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.closed = False
        self.mute = False  # the server's answers are no longer passed on (cut_after: the client must not hear it)
        self.lock = threading.Lock()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for s in (self.client, self.server):
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes a pump blocked in recv
            except OSError:
                pass
            s.close()


class FaultProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to host:port. Use as a context manager, or close()."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port: int = self.listener.getsockname()[1]
        self.pairs: list[_Pair] = []
        self.lock = threading.Lock()
        self.flowing = threading.Event()
        self.flowing.set()
        self.delay: float | None = None
        self.refuse_until = 0.0
        self.trigger: bytes | None = None
        self.accepted = 0
        self.events: list[tuple[float, str]] = []
        self._stopped = False
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    @classmethod
    def before(cls, dsn: str) -> FaultProxy:
        """A proxy in front of the server a DSN names (host and port: a TCP address, or 127.0.0.1 and the port of
        a Unix socket's server)."""
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        host = str(params.get("host") or "127.0.0.1")
        if host.startswith("/"):
            host = "127.0.0.1"
        return cls(host, int(params.get("port") or 5432))

    def dsn(self, dsn: str) -> str:
        """dsn, through this proxy."""
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        params.pop("hostaddr", None)
        params.update(host="127.0.0.1", port=str(self.port))
        return psycopg.conninfo.make_conninfo(**params)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # faults -----------------------------------------------------------------------------------------------
    def cut(self) -> int:
        """Every current connection closed, both sides; how many."""
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for p in pairs:
            p.close()
        self._event(f"cut {len(pairs)}")
        return len(pairs)

    def refuse(self, seconds: float) -> None:
        self.refuse_until = time.monotonic() + seconds
        self.cut()
        self._event(f"refuse {seconds}s")

    def stall(self, seconds: float) -> None:
        """Nothing forwarded for that long (returns at once; a timer lets the bytes go again)."""
        self.flowing.clear()
        self._event(f"stall {seconds}s")
        t = threading.Timer(seconds, self._resume)
        t.daemon = True
        t.start()

    def _resume(self) -> None:
        self.flowing.set()
        self._event("flowing")

    def slow(self, seconds: float | None) -> None:
        self.delay = seconds
        self._event(f"slow {seconds}")

    def cut_after(self, pattern: bytes) -> None:
        self.trigger = pattern
        self._event(f"armed {pattern!r}")

    def close(self) -> None:
        self._stopped = True
        try:
            self.listener.close()
        except OSError:
            pass
        self.flowing.set()
        self.cut()

    def _event(self, what: str) -> None:
        self.events.append((time.perf_counter(), what))

    # forwarding -------------------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if time.monotonic() < self.refuse_until:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(client, server)
            with self.lock:
                self.pairs.append(pair)
                self.accepted += 1
            threading.Thread(target=self._pump, args=(pair, client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(pair, server, client, False), daemon=True).start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while True:
                block = src.recv(_BLOCK)
                if not block:
                    break
                self.flowing.wait()
                if self.delay:
                    time.sleep(self.delay)
                if pair.closed:
                    break
                if not upstream and pair.mute:
                    continue
                trigger = self.trigger
                fire = upstream and trigger is not None and trigger in block
                if fire:
                    self.trigger = None
                    pair.mute = True
                dst.sendall(block)
                if fire:
                    self._event(f"sent {trigger!r}")
                    time.sleep(0.05)  # the server reads it before it sees its client go
                    self.cut()
                    break
        except OSError:
            pass
        finally:
            pair.close()
            with self.lock:
                if pair in self.pairs:
                    self.pairs.remove(pair)

