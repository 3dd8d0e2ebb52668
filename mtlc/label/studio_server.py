"""The HTTP server of a Label Studio ML backend (studio_backend.py answers): a thread a request, so
two requests at once are served together (the backend's model version is swapped whole, the labels
file written under a lock); Label Studio's basic auth where a user and password are given, compared
in constant time; a body over MAX_BODY_BYTES, not JSON, or on an unknown route refused with a line,
and the server goes on. A refusal's line is the HTTP reason phrase as well as the JSON's "error":
Label Studio shows the reason.
"""
import base64
import hmac
import json
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .studio_backend import BadRequest

MAX_BODY_BYTES = 64 * 2 ** 20  # Label Studio sends tasks without their images: 100,000 tasks fit
READ_TIMEOUT_S = 60  # a request's body must arrive within this, however slowly it trickles
CONNECTIONS = 32  # connections served at once; one more is answered 503 and closed
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

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def route(self, method):
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        self.body_read = method != "POST"
        try:
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
            self.refuse(500, f"the backend failed on this request ({type(exc).__name__}: {exc})")

    def json_body(self):
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked" or length is None:
            raise BadRequest("the request has no Content-Length", status=411)
        try:
            length = int(length)
        except ValueError:
            raise BadRequest("the request's Content-Length is not a number") from None
        if length < 0 or length > MAX_BODY_BYTES:
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
    cannot take every thread)."""
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, *args, **kwargs):
        self.slots = threading.BoundedSemaphore(CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
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
