"""hearsay-run --metrics HOST:PORT: one /metrics for the whole cluster it runs (docs/OPERATIONS.md).

Each peer process serves its own /metrics (hearsay-peer --metrics, on a loopback port
picked here); this server answers a scrape by scraping every peer of the run in progress
and merging their families, each sample labelled with its peer, plus two families of its
own about each peer:

- hearsay_peer_scrape_ok{peer}: 1 when the peer's /metrics answered this scrape (within
  PEER_TIMEOUT_S, tried twice), so its samples are in it; 0 when they are missing.
- hearsay_peer_up{peer}: 1 while the peer's process is there: its endpoint answered, or
  took the connection and did not answer in time (busy, or starved by other clients);
  0 when nothing listens at its port (not started yet, or gone). So a live peer whose
  endpoint was starved reads up 1, scrape_ok 0, never "down".

The HTTP side is Python's http.server with the bounds of hearsay-peer's own endpoint
(src/metrics/metrics_server.cpp): at most MAX_HANDLERS connections are served at once, a
thread each, and one more is answered 503 and closed at once, so idle connections cannot
multiply threads; a connection must deliver its request line and headers (REQUEST_BYTES
at most) within READ_DEADLINE_S of its accept however slowly it trickles them, and take
its answer within WRITE_TIMEOUT_S; one request per connection. Anything but GET or HEAD is
answered 405, a request with a body or two Content-Lengths 400, at once, its body never
read. Scrapes that arrive while one is being rendered share its result, so that they do
not multiply the load on the peers either."""
import concurrent.futures
import http.client
import http.server
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

PEER_TIMEOUT_S = 1.0  # each try at a peer's /metrics (connect, and each read)
MAX_HANDLERS = 128  # connections served at once: more than a few scrapers and the odd slow client
READ_DEADLINE_S = 2.0  # from accept to the end of the request's headers
WRITE_TIMEOUT_S = 5.0  # for the whole answer to be taken (sendall's timeout is a total)
REQUEST_BYTES = 16384  # request line and headers together
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def free_ports(n):
    """n ports of 127.0.0.1 free now (bound together, so they differ, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def with_peer_label(sample, peer):
    """A sample line with peer="..." first among its labels (left as it is if it has one)."""
    i = 0
    while i < len(sample) and sample[i] not in "{ ":
        i += 1
    name, rest = sample[:i], sample[i:]
    label = 'peer="' + peer.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if not rest.startswith("{"):
        return f"{name}{{{label}}}{rest}"
    j, quoted = 1, False  # the closing brace, outside the label values' quotes
    while j < len(rest) and (quoted or rest[j] != "}"):
        if quoted and rest[j] == "\\":
            j += 1
        elif rest[j] == '"':
            quoted = not quoted
        j += 1
    labels = rest[1:j]
    if re.search(r'(^|,)peer="', labels):
        return sample
    return f"{name}{{{label}{',' if labels else ''}{labels}{rest[j:]}"


def merge_expositions(texts):
    """{peer: exposition text} -> one exposition: each family's HELP and TYPE once, then every
    peer's samples of it, labelled with the peer."""
    families = {}  # name -> [help line, type line, samples]; in order of first appearance
    for peer, text in texts.items():
        current = None
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                name = line.split(" ", 3)[2]
                fam = families.setdefault(name, [None, None, []])
                slot = 0 if line.startswith("# HELP ") else 1
                fam[slot] = fam[slot] or line
                current = fam
            elif line and not line.startswith("#"):
                if current is None:
                    current = families.setdefault(line.split("{", 1)[0].split(" ", 1)[0], [None, None, []])
                current[2].append(with_peer_label(line, peer))
    out = []
    for help_line, type_line, samples in families.values():
        out += [x for x in (help_line, type_line) if x] + samples
    return "\n".join(out) + "\n" if out else ""


def refusal(method, headers):
    """(status, why) for a request refused on its headers alone, before any body is read;
    (0, "") when it is not. The same rules as hearsay-peer's endpoint."""
    lengths = headers.get_all("Content-Length") or []
    chunked = headers.get("Transfer-Encoding") is not None
    if len(lengths) > 1:
        return 400, "more than one Content-Length\n"
    if lengths and chunked:
        return 400, "both Content-Length and Transfer-Encoding\n"
    if method not in ("GET", "HEAD"):
        return 405, "only GET and HEAD\n"
    if chunked or (lengths and lengths[0].strip() != "0"):
        return 400, "a scrape carries no body\n"
    return 0, ""


def scrape_peer(port):
    """(the exposition text or None, whether something listens at the port): tried twice,
    unless the connection is refused (then nothing is there to answer)."""
    for _ in range(2):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=PEER_TIMEOUT_S) as r:
                return r.read().decode(), True
        except urllib.error.URLError as e:
            if isinstance(e.reason, ConnectionRefusedError):
                return None, False
        except (OSError, ValueError, http.client.HTTPException):
            pass  # timed out, reset, or a broken answer: the process is there all the same
    return None, True


class _Capped:
    """A request's reader that hands out at most `cap` bytes in all: a request line and
    headers larger than that end early (answered 431) rather than fill memory."""

    def __init__(self, f, cap):
        self._f, self._left, self.spent = f, cap, False

    def readline(self, limit=-1):
        n = self._left if limit is None or limit < 0 else min(limit, self._left)
        line = self._f.readline(n) if n > 0 else b""
        self._left -= len(line)
        self.spent = self.spent or self._left <= 0
        return line

    def close(self):
        self._f.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    timeout = READ_DEADLINE_S  # each read; the server's deadline bounds them all together

    def setup(self):
        super().setup()
        self.rfile = _Capped(self.rfile, REQUEST_BYTES)

    def handle(self):
        try:
            self.close_connection = True
            self.raw_requestline = self.rfile.readline(REQUEST_BYTES)
            if not self.raw_requestline or not self.parse_request():
                return  # gone, or answered already (400, 431, 505 ...)
            if self.rfile.spent:
                self.answer(431, f"request line and headers over {REQUEST_BYTES} bytes\n".encode())
                return
            self.server.done_reading(self.connection)
            self.connection.settimeout(WRITE_TIMEOUT_S)
            status, why = refusal(self.command, self.headers)
            if status:
                self.answer(status, why.encode())
            elif self.path != "/metrics":
                self.answer(404, b"not found: the metrics are at /metrics\n")
            else:
                self.answer(200, self.server.owner.shared_render().encode(), CONTENT_TYPE)
        except OSError:
            pass  # timed out, shut down past its deadline, or gone: nobody to answer

    def answer(self, status, body, content_type="text/plain; charset=utf-8"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        if status == 405:
            self.send_header("Allow", "GET, HEAD")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, *args):
        pass  # scrapes are not news


class _Server(http.server.ThreadingHTTPServer):
    """ThreadingHTTPServer with a bound on its threads and a deadline on each request."""
    daemon_threads = True
    block_on_close = False  # close() does not wait for handlers: they end at their deadlines
    request_queue_size = 128  # a burst of connections waits for accept, not for SYN retries
    _BUSY = b"busy: too many connections\n"

    def __init__(self, address, owner):
        self.owner = owner
        self._slots = threading.BoundedSemaphore(MAX_HANDLERS)
        self._lock = threading.Lock()
        self._reading = {}  # socket -> deadline (time.monotonic()) while its request is read
        super().__init__(address, _Handler)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            try:  # a word of why, without waiting for the client to take it
                request.setblocking(False)
                request.send(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(self._BUSY), self._BUSY))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        with self._lock:
            self._reading[request] = time.monotonic() + READ_DEADLINE_S
        try:
            super().process_request(request, client_address)  # its thread releases the slot
        except BaseException:
            self.done_reading(request)
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def done_reading(self, request):
        with self._lock:
            self._reading.pop(request, None)

    def shutdown_request(self, request):
        self.done_reading(request)  # so that a socket is never shut down once it is closed
        super().shutdown_request(request)

    def service_actions(self):
        # serve_forever calls this after every poll: a request still being read past its
        # deadline has its socket shut down, so the handler's read ends, and its thread.
        self.shut_reading(time.monotonic())

    def shut_reading(self, now=float("inf")):
        """Shuts down the sockets of requests still being read at `now` past their deadline
        (all of them by default)."""
        with self._lock:
            for sock, deadline in list(self._reading.items()):
                if now >= deadline:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    del self._reading[sock]

    def handle_error(self, request, client_address):
        e = sys.exc_info()[1]
        if not isinstance(e, OSError):  # a client gone is not news; a bug in rendering is
            sys.stderr.write(f"hearsay-run: --metrics: answering {client_address[0]}: {type(e).__name__}: {e}\n")


class ClusterMetrics:
    """Serves the merged /metrics of the peers set with set_peers() at `address` (HOST:PORT)."""

    def __init__(self, address):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--metrics '{address}': use HOST:PORT")
        self._lock = threading.Lock()
        self._peers = {}  # name -> port of its own /metrics
        self._render_cv = threading.Condition()
        self._rendering, self._rendered, self._generation = False, "", 0
        try:
            self._server = _Server((host.strip("[]"), int(port)), self)
        except OSError as e:
            raise ValueError(f"--metrics '{address}': cannot serve there ({e.strerror})") from e
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    def set_peers(self, ports):
        with self._lock:
            self._peers = dict(ports)

    def shared_render(self):
        """render(), shared: a scrape that arrives while one is being rendered takes its
        result instead of scraping every peer again."""
        with self._render_cv:
            if self._rendering:
                generation = self._generation
                while self._generation == generation:
                    self._render_cv.wait()
                return self._rendered
            self._rendering = True
        text = ""
        try:
            text = self.render()
        finally:
            with self._render_cv:
                self._rendering, self._rendered = False, text
                self._generation += 1
                self._render_cv.notify_all()
        return text

    def render(self):
        with self._lock:
            peers = dict(self._peers)
        # All at once, so that a scrape takes one peer's tries at most, not one each.
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(peers)))) as pool:
            answers = dict(zip(peers, pool.map(scrape_peer, peers.values())))
        head = ["# HELP hearsay_peer_up Whether the peer's process is there (1: its endpoint answered or took the "
                "connection) or nothing listens at its port (0).",
                "# TYPE hearsay_peer_up gauge"]
        head += [f'hearsay_peer_up{{peer="{name}"}} {int(listening)}' for name, (_, listening) in answers.items()]
        head += ["# HELP hearsay_peer_scrape_ok Whether the peer's /metrics answered this scrape in time (1) or "
                 "its samples are missing from it (0).",
                 "# TYPE hearsay_peer_scrape_ok gauge"]
        head += [f'hearsay_peer_scrape_ok{{peer="{name}"}} {int(text is not None)}' for name, (text, _) in answers.items()]
        texts = {name: text for name, (text, _) in answers.items() if text is not None}
        return "\n".join(head) + "\n" + merge_expositions(texts)

    def close(self):
        self._server.shutdown()
        self._server.shut_reading()  # no reaper runs from here on
        self._server.server_close()
