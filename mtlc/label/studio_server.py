"""The HTTP server of a Label Studio ML backend (studio_backend.py answers): a thread a request, so
two requests at once are served together (the backend's model version is swapped whole, the labels
file written under a lock); Label Studio's basic auth where a user and password are given, compared
in constant time; a body over MAX_BODY_BYTES, not JSON, or on an unknown route refused with a line,
and the server goes on. A refusal's line is the HTTP reason phrase as well as the JSON's "error":
Label Studio shows the reason. Framing that two readers could read two ways (a Transfer-Encoding, two
Content-Lengths, one that is not plain digits) is refused with 400 and the connection closed, as a
server behind a proxy must (request smuggling). A connection has HEADER_DEADLINE_S for its request
line and headers, whatever it sends meanwhile; where every slot is taken, the connection that has
waited longest without a whole request is closed for the new one, so idle or dribbling clients
cannot keep an authenticated one out. The listen queue holds a burst as large as the slots.
"""
import base64
import hmac
import json
import re
import socket
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .studio_backend import BadRequest

MAX_BODY_BYTES = 64 * 2 ** 20  # Label Studio sends tasks without their images: 100,000 tasks fit
READ_TIMEOUT_S = 60  # a request's body must arrive within this, however slowly it trickles
CONNECTIONS = 32  # connections served at once; one more takes the slot of one idle longest, else 503
HEADER_DEADLINE_S = 10  # a request line and its headers must arrive within this, however slowly
SLOT_WAIT_S = 2  # how long a new connection waits for the slot of a closed idle one
DIGITS = re.compile(r"[0-9]{1,18}")  # a Content-Length: ASCII digits only (int() takes "+14", "1_4", "١٤")
ROUTES = {("GET", "/"): "health", ("GET", "/health"): "health", ("POST", "/setup"): "setup",
          ("POST", "/predict"): "predict", ("POST", "/webhook"): "webhook", ("POST", "/train"): "train"}


def printable(text, most=900):
    """A line that shows as itself: whitespace runs one space, any other unprintable character '?'."""
    return "".join(c if c.isprintable() else "?" for c in " ".join(str(text).split()))[:most]


def reason_phrase(message):
    """A line as an HTTP reason phrase: printable, Latin-1 (what the status line may hold)."""
    return printable(message).encode("latin-1", "replace").decode("latin-1")


def expected_headers(auth):
    """The Authorization headers that carry (user, password): Label Studio's client encodes them as
    Latin-1 (requests' HTTPBasicAuth), others as UTF-8."""
    if auth is None:
        return None
    headers = set()
    for encoding in ("latin-1", "utf-8"):
        try:
            headers.add(b"Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode(encoding)))
        except UnicodeEncodeError:
            pass
    return headers


class Handler(BaseHTTPRequestHandler):
    """A request to a backend (handler_for binds one: its backend, the auth headers it takes, its echo)."""
    protocol_version = "HTTP/1.1"
    server_version = "mtlc-label-studio-backend"
    backend = expected = None
    echo = staticmethod(print)

    def version_string(self):  # the Server header: no Python version for a stranger
        return self.server_version

    def handle_one_request(self):
        """One request, its line and headers within HEADER_DEADLINE_S of the wait for it (the server
        closes the connection after that); idle meanwhile, its slot may go to a new connection."""
        self.server.waiting(self.connection)
        try:
            super().handle_one_request()
        finally:
            self.server.working(self.connection)

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def route(self, method):
        self.server.working(self.connection)
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        self.body_read = method != "POST"
        try:
            self.check_framing()
            given = self.headers.get("Authorization", "").encode("latin-1", "replace")
            if self.expected is not None and not any([hmac.compare_digest(given, e) for e in self.expected]):
                raise BadRequest("a Label Studio basic-auth user and password are needed (Settings > Model: "
                                 "Use basic auth)", status=401)
            name = ROUTES.get((method, path))
            if name is None:
                raise BadRequest(f"{method} {printable(path, 80)} is not a route of this backend (GET /health; POST "
                                 f"/setup, /predict, /webhook, /train)", status=404)
            body = self.json_body() if method == "POST" else None
            self.answer(200, getattr(self.backend, name)(*(() if body is None else (body,))))
        except BadRequest as exc:
            self.refuse(exc.status, exc.message)
        except Exception as exc:  # a bug must not stop the server: said, and the request refused
            self.echo(f"{method} {printable(path, 80)}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            self.refuse(500, f"the backend failed on this request ({type(exc).__name__}; its log says more)")

    def check_framing(self):
        """BadRequest (400, the connection closed) where the body's length is not one plain
        Content-Length: any Transfer-Encoding (this backend reads no chunked body), two
        Content-Lengths, or one that is not ASCII digits."""
        encodings, lengths = self.headers.get_all("Transfer-Encoding") or [], self.headers.get_all("Content-Length") or []
        why = ("a Transfer-Encoding (send the body with one Content-Length)" if encodings else
               f"{len(lengths)} Content-Length headers" if len(lengths) > 1 else
               "a Content-Length that is not a number" if lengths and not DIGITS.fullmatch(lengths[0]) else None)
        if why:
            self.close_connection = True
            raise BadRequest(f"the request's framing is ambiguous: {why}")

    def json_body(self):
        length = self.headers.get("Content-Length")
        if length is None:
            raise BadRequest("the request has no Content-Length", status=411)
        length = int(length)  # plain digits (check_framing)
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # its body is not read
            raise BadRequest(f"the request is {length:,} bytes, over the {MAX_BODY_BYTES:,} this backend reads",
                             status=413)
        raw, deadline = bytearray(), time.monotonic() + READ_TIMEOUT_S
        while len(raw) < length:
            try:
                chunk = self.rfile.read(min(length - len(raw), 2 ** 20))
            except TimeoutError:  # the socket's own timeout: nothing came for READ_TIMEOUT_S
                chunk = b""
            if not chunk or time.monotonic() > deadline:
                self.close_connection = True
                raise BadRequest(f"the request's body did not arrive within {READ_TIMEOUT_S} s", status=408)
            raw += chunk
        self.body_read = True
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise BadRequest(f"the request is not JSON ({type(exc).__name__}: {str(exc)[:120]})") from None

    def answer(self, status, payload, reason=None):
        data = json.dumps(payload).encode()
        self.send_response(status, reason)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="mtlc"')
        self.end_headers()
        self.wfile.write(data)

    def refuse(self, status, message):
        self.echo(f"{self.command} {printable(self.path, 80)}: {status} {printable(message, 2000)}")
        if not self.body_read:  # its body, unread, would be taken for the next request
            self.close_connection = True
        self.answer(status, {"error": message}, reason_phrase(message))

    def log_message(self, format, *args):  # each request's line: quiet unless refused (refuse says it)
        pass


def handler_for(backend, auth, echo):
    """The request handler class of a backend; auth: (user, password) or None."""
    return type("BackendHandler", (Handler,), dict(backend=backend, expected=expected_headers(auth),
                                                    echo=staticmethod(echo), timeout=READ_TIMEOUT_S))


class StudioServer(ThreadingHTTPServer):
    """A thread a connection, at most CONNECTIONS at once (a client that holds connections open
    cannot take every thread: module docstring)."""
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 2 * CONNECTIONS  # the listen backlog: a burst is queued, never reset

    def __init__(self, *args, **kwargs):
        self.slots = threading.BoundedSemaphore(CONNECTIONS)
        self.idle, self.idle_lock = {}, threading.Lock()  # connection -> when it began to wait for a request
        super().__init__(*args, **kwargs)
        threading.Thread(target=self.cut_late_headers, daemon=True, name="mtlc header deadline").start()

    def waiting(self, connection):
        with self.idle_lock:
            self.idle[connection] = time.monotonic()

    def working(self, connection):
        with self.idle_lock:
            self.idle.pop(connection, None)

    def cut(self, connection):
        """End a connection waiting for its request: its handler reads the end and returns."""
        self.working(connection)
        try:
            connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def server_close(self):
        self.closed = True
        super().server_close()

    def cut_late_headers(self):
        while not getattr(self, "closed", False):
            time.sleep(min(1.0, HEADER_DEADLINE_S / 4))
            now = time.monotonic()
            with self.idle_lock:
                late = [c for c, since in self.idle.items() if now - since > HEADER_DEADLINE_S]
            for connection in late:
                self.cut(connection)

    def free_a_slot(self):
        """A slot, the connection idle longest closed for it where none is free; False where none is."""
        if self.slots.acquire(blocking=False):
            return True
        with self.idle_lock:
            oldest = min(self.idle, key=self.idle.get, default=None)
        if oldest is not None:
            self.cut(oldest)
        return self.slots.acquire(timeout=SLOT_WAIT_S)

    def process_request(self, request, client_address):
        if not self.free_a_slot():
            try:
                request.sendall(b"HTTP/1.1 503 busy: too many connections at once\r\nContent-Length: 0\r\n"
                                b"Connection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def make_server(backend, host, port, auth=None, echo=print):
    """The server, bound (port 0: a free one, server.server_address says which); serve_forever() serves."""
    return StudioServer((host, port), handler_for(backend, auth, echo))
