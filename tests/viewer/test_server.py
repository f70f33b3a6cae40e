"""viewer.server: the viewer is served by waitress with its limits set. A client that trickles its
request holds no worker (issue 32: one header byte every 10 s held a thread of the hand-made
server forever, and 32 such clients locked everyone out), idle connections are closed, larger
bodies are refused, memory is released once the server stays quiet, and malformed framework
requests get 4xx. Requests go to 127.0.0.1 only, in bounded loops."""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from viewer import server as S

T = 30
# a server thread that dies with an exception fails its test (one closed mid-select once warned in CI)
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def _hello(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "5")])
    return [b"hello"]


class Serving:
    """A server run in a thread of the test. `epscope view` runs it in its main thread and closes it
    there; closed from here, its loop may be inside select() on the sockets being closed (EBADF, or
    ValueError for a socket already -1): that end of the loop is the test's shutdown, not a fault."""
    def __init__(self, app=_hello, **kw):
        self.srv = S.make_server(app, "127.0.0.1", 0, **kw)
        self.port = self.srv.effective_port
        self.closing = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.srv.run()
        except (OSError, ValueError):
            if not self.closing:
                raise

    def get(self, path="/", timeout=T) -> bytes:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout).read()

    def close(self):
        self.closing = True
        self.srv.close()
        self.thread.join(timeout=T)


@pytest.fixture()
def srv():
    s = Serving(threads=2, channel_timeout_s=1, cleanup_interval_s=0.2)
    yield s
    s.close()


def _trickle(port: int, stop: threading.Event) -> None:
    """A client that sends one byte of its request line every 0.2 s and never finishes."""
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=T)
    except OSError:
        return
    with c:
        for b in b"GET /slow HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 10_000:
            if stop.wait(0.2):
                return
            try:
                c.send(bytes([b]))
            except OSError:
                return


def test_trickling_clients_hold_no_worker():
    """64 clients trickling their requests against a server of 2 workers: every normal request is
    answered (the hand-made server had given each of them a thread)."""
    s = Serving(threads=2, channel_timeout_s=T, cleanup_interval_s=1)
    stop = threading.Event()
    clients = [threading.Thread(target=_trickle, args=(s.port, stop), daemon=True) for _ in range(64)]
    try:
        for c in clients:
            c.start()
        time.sleep(1.0)   # all connected, each mid-request
        for _ in range(20):
            assert s.get() == b"hello"
    finally:
        stop.set()
        for c in clients:
            c.join(T)
        s.close()


def test_idle_connections_are_closed(srv):
    c = socket.create_connection(("127.0.0.1", srv.port), timeout=T)
    t0 = time.monotonic()
    assert c.recv(10) == b""        # the server closed it
    assert time.monotonic() - t0 < 10
    c.close()


def test_bodies_past_the_limit_are_refused_before_the_app(srv):
    seen = []

    def app(environ, start_response):
        seen.append(1)
        return _hello(environ, start_response)
    s = Serving(app, threads=1)
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=T) as c:
            c.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (S.MAX_BODY_BYTES + 1) + b"x" * 1000)
            answer = c.recv(200)
        assert answer.startswith(b"HTTP/1.1 413") and not seen
    finally:
        s.close()


def test_serve_uses_the_waitress_server(monkeypatch, tmp_path):
    from viewer import app as A
    made = {}

    class Fake:
        def __init__(self, app, host, port):
            made["args"] = (host, port)

        def run(self):
            made["served"] = True

        def close(self):
            made["closed"] = True
    monkeypatch.setattr(S, "make_server", lambda app, host, port: Fake(app, host, port))
    A.serve([tmp_path], "127.0.0.1", 8123)
    assert made == {"args": ("127.0.0.1", 8123), "served": True, "closed": True}
    import waitress.server
    monkeypatch.undo()
    s = S.make_server(_hello, "127.0.0.1", 0)
    try:
        assert isinstance(s, waitress.server.BaseWSGIServer) and s.adj.threads == S.THREADS
        assert s.adj.connection_limit == S.CONNECTION_LIMIT and s.adj.max_request_body_size == S.MAX_BODY_BYTES
    finally:
        s.close()


def test_memory_is_released_once_the_server_stays_quiet_not_at_each_quiet_moment(monkeypatch):
    """A page load's requests come in bursts; releasing memory (a full gc.collect holding the GIL)
    each time the last request ended cost 0.1-0.5 s a time, several times per cold page."""
    monkeypatch.setattr(S, "release_memory", lambda: None)
    s = Serving(threads=2, quiet_s=0.6)
    try:
        t0 = time.monotonic()
        for _ in range(4):   # four bursts, 0.1 s apart: no release between
            assert s.get() == b"hello"
            time.sleep(0.1)
        burst_s = time.monotonic() - t0
        deadline = time.monotonic() + T
        while not s.srv.quiet.releases:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert time.monotonic() - t0 >= 0.6
        time.sleep(1.0)
        if burst_s < 0.6:    # the machine kept up: the bursts were closer than quiet_s
            assert s.srv.quiet.releases == 1
    finally:
        s.close()


# -- malformed framework requests (issue 32: 9 kinds of HTTP 500 from Dash) --------------------------
@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from tests.viewer.runs import synthetic
    from viewer.app import create_app
    root = tmp_path_factory.mktemp("server-root")
    synthetic(root, "balanced", events=2000)
    app = create_app([root], cache_dir=tmp_path_factory.mktemp("server-cache"))
    c = app.server.test_client()
    assert c.get("/").status_code == 200
    return app, c


ROUTE = "..page.children...nav.children...run-select.value...url.search.."
OUTPUTS = [{"id": "page", "property": "children"}, {"id": "nav", "property": "children"},
           {"id": "run-select", "property": "value"}, {"id": "url", "property": "search"}]
INPUTS = [{"id": "url", "property": "pathname", "value": "/"}, {"id": "url", "property": "search", "value": ""},
          {"id": "run-select", "property": "value", "value": None}]
GOOD = {"output": ROUTE, "outputs": OUTPUTS, "inputs": INPUTS, "changedPropIds": ["url.pathname"]}


@pytest.mark.parametrize("body", [
    "[]", "{}", "5", '"x"', json.dumps({"output": 5}), json.dumps({**GOOD, "output": "nope.x"}),
    json.dumps({**GOOD, "outputs": OUTPUTS[:1]}), json.dumps({**GOOD, "outputs": {"id": 3}}),
    json.dumps({**GOOD, "inputs": INPUTS[:2]}), json.dumps({**GOOD, "inputs": 5}),
    json.dumps({**GOOD, "inputs": [INPUTS[1], INPUTS[0], INPUTS[2]]}), json.dumps({**GOOD, "inputs": [5, 6, 7]}),
    json.dumps({**GOOD, "state": [{"id": "url", "property": "x"}]}), json.dumps({**GOOD, "changedPropIds": "x"}),
    json.dumps({**GOOD, "changedPropIds": [5]}),
])
def test_malformed_callback_bodies_get_400(client, body):
    _, c = client
    r = c.post("/_dash-update-component", data=body, content_type="application/json")
    assert r.status_code == 400, (body, r.status_code)


def test_a_good_callback_body_is_served(client):
    _, c = client
    assert c.post("/_dash-update-component", json=GOOD).status_code == 200


@pytest.mark.parametrize("path", ["nope/x.js", "dash/../../etc/passwd", "dash/nope.js", "dash/dcc/nope.v1.js",
                                  "dash/%ff.js", "plotly/package_data/nope.js", "dash/deps/react@18.v9m9.js"])
def test_bad_component_paths_get_404(client, path):
    _, c = client
    assert c.get(f"/_dash-component-suites/{path}").status_code == 404


def test_callback_body_problem_accepts_what_the_renderer_sends_for_every_callback(client):
    app, _ = client
    for key, cb in app.callback_map.items():
        n = len(cb["outputs_indices"]) if isinstance(cb["outputs_indices"], list) else 1
        outs = [{"id": "x", "property": "y"}] * n
        body = {"output": key, "outputs": outs if isinstance(cb["outputs_indices"], list) else outs[0],
                "inputs": [{"id": str(i["id"]), "property": i["property"], "value": None} for i in cb["inputs"]],
                "state": [{"id": str(i["id"]), "property": i["property"], "value": None} for i in cb["state"]],
                "changedPropIds": []}
        assert S.callback_body_problem(app.callback_map, body) is None, key


def test_a_run_of_a_long_name_downloads(tmp_path):
    """A 250-character run name gave HTTP 500 on download (the exported trace's file name in the
    cache directory was longer than the file system allows)."""
    from tests.viewer.runs import synthetic
    from viewer.app import create_app
    p = synthetic(tmp_path / "root", "r", events=1000)
    os.rename(p, p.with_name("r" * 250))
    app = create_app([tmp_path / "root"], cache_dir=tmp_path / "cache")
    (run_id,) = app.catalog.ids()
    r = app.server.test_client().get(f"/download/{run_id}.perfetto-trace")
    try:
        assert r.status_code == 200 and len(r.data) > 1000
    finally:
        r.close()   # the response streams the exported file: a WSGI server closes it after sending
