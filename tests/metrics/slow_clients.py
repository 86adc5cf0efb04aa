"""Hostile clients of a /metrics endpoint, for the bounds tests (test_metrics_bounds.py,
test_peer_metrics_bounds.py): slowloris connections and an endless chunked body, all on
one thread of the test process, each reconnecting as soon as the server closes it (as an
attacker would), plus one-shot requests timed to their answer."""
import selectors
import socket
import threading
import time

CHUNK = b"10\r\n" + b"x" * 16 + b"\r\n"


def ask(port, request, timeout=5.0):
    """Sends `request` (bytes) to 127.0.0.1:port and reads until the server closes:
    (status code or 0, seconds to the first byte of the answer or None, the whole answer)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    t0 = time.monotonic()
    first, out = None, b""
    try:
        s.sendall(request)
        while True:
            b = s.recv(65536)
            if not b:
                break
            first = first if first is not None else time.monotonic() - t0
            out += b
    except OSError:
        pass  # reset after the answer (a body left unread) or timed out: what came is kept
    finally:
        s.close()
    status = int(out[9:12]) if out.startswith(b"HTTP/1.") and out[9:12].isdigit() else 0
    return status, first, out


class Attack:
    """`slow` connections that send a request line, then a header byte each every
    `byte_every_s`, and one that POSTs an endless chunked body; run() until stop().
    lifetimes: how long each connection the server closed had lived (the ones still open
    at stop() are counted at their age then); post_answers: (seconds to the answer, its
    first line) of each chunked POST."""

    def __init__(self, port, slow=100, byte_every_s=1.0):
        self.port, self.slow, self.byte_every_s = port, slow, byte_every_s
        self.lifetimes, self.post_answers = [], []
        self.connect_errors = 0
        self._stop = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        for _ in range(self.slow):
            self._open("slow")
        self._open("post")
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()
        now = time.monotonic()
        for key in list(self._sel.get_map().values()):
            self.lifetimes.append(now - key.data["opened"])
            key.fileobj.close()
        self._sel.close()

    def _open(self, kind):
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            if kind == "slow":
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            else:
                s.sendall(b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
            s.setblocking(False)
        except OSError:
            self.connect_errors += 1
            return
        now = time.monotonic()
        self._sel.register(s, selectors.EVENT_READ, {"kind": kind, "opened": now, "next": now + self.byte_every_s,
                                                     "answered": False})

    def _closed(self, s, data):
        self._sel.unregister(s)
        s.close()
        self.lifetimes.append(time.monotonic() - data["opened"])
        if not self._stop.is_set():
            self._open(data["kind"])

    def _run(self):
        while not self._stop.is_set():
            for key, _ in self._sel.select(0.02):
                s, data = key.fileobj, key.data
                try:
                    b = s.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    b = b""
                if data["kind"] == "post" and b and not data["answered"]:
                    data["answered"] = True
                    self.post_answers.append((time.monotonic() - data["opened"], b.split(b"\r\n", 1)[0].decode("latin-1")))
                if not b:
                    self._closed(s, data)
            now = time.monotonic()
            for key in list(self._sel.get_map().values()):
                s, data = key.fileobj, key.data
                try:
                    if data["kind"] == "post":
                        s.send(CHUNK)  # as fast as it goes
                    elif now >= data["next"]:
                        s.send(b"a")
                        data["next"] = now + self.byte_every_s
                except BlockingIOError:
                    pass
                except OSError:
                    self._closed(s, data)
