"""The HTTP server `epscope view` runs: waitress (a production WSGI server), its limits set, and
the checks that answer malformed requests with 4xx before Dash sees them.

Why waitress (issue 32): the hand-made bounded werkzeug server before it gave each connection a
thread and closed a connection only after IDLE_TIMEOUT_S without a byte, so one header byte every
10 s kept a thread forever, and 32 such clients took every slot (a normal page loaded in 3 of ~60
tries). Waitress reads every request whole (headers and body) in its event loop before a worker
thread sees it, and buffers every response: a client that trickles its request or reads its answer
slowly holds a socket and a buffer, never a worker. What that made unnecessary is gone: the
connection-slot semaphore, the 503 "busy" answers and the per-read idle timeout.

Limits (`make_server`): THREADS workers; CONNECTION_LIMIT connections open at once (one more
waits in the listen backlog); a connection idle CHANNEL_TIMEOUT_S is closed; request headers at
most MAX_HEADER_BYTES, bodies at most MAX_BODY_BYTES (larger get HTTP 413 before the app runs).

Kept from before: glibc's malloc keeps at most MALLOC_ARENAS arenas (`limit_malloc_arenas`,
before any thread starts: with one arena per busy thread, memory a flood's threads freed stayed
in their arenas), and what the requests freed goes back to the system (jobs.release_memory) once
the app has had no request in flight for QUIET_S, not at each moment its last request ends (a
page load has several, and each release took 0.1-0.5 s of the GIL; benchmarks/NOTES.md, "cold
pages round 2").

Malformed requests (`install_request_checks`): a callback request whose body is not what Dash's
renderer sends for a registered callback (its output, its inputs and states in order) gets 400;
a component-suite path that names no registered package file gets 404 (Dash raised, giving 9
kinds of HTTP 500, issue 32).
"""
from __future__ import annotations

import threading
from typing import Any

from werkzeug.wsgi import ClosingIterator

from .jobs import release_memory

# 8 workers: a page's requests run a few at a time (Dash sends its callbacks in parallel, and a
# callback may wait up to jobs.READY_WAIT_S for a background result); the 2-core development
# machine is not oversubscribed by more of them, since a request is whole before it takes one.
THREADS = 8
# Connections held open at once: each costs a socket and its buffers in waitress's event loop, no
# thread; a browser opens up to 6. 512 serves 64 slow clients beside a few users with room (the
# benchmark: benchmarks/bench_slow_clients.py) within the default 1,024 open files.
CONNECTION_LIMIT = 512
# Dash's polls come every 0.4 s and a page's callbacks within a second: a connection without a
# byte for 30 s belongs to a closed tab or a stalled client (it holds no worker meanwhile).
CHANNEL_TIMEOUT_S = 30
CLEANUP_INTERVAL_S = 5
MAX_HEADER_BYTES = 64 << 10
# The largest legitimate request: the timeline sends its current figure back as state, up to
# 2.1 MB (viewer.app.MAX_REQUEST_BYTES says where that came from); 8 MB leaves room.
MAX_BODY_BYTES = 8 << 20
QUIET_S = 1.0


class QuietRelease:
    """WSGI middleware: counts requests in flight (until their response is sent) and releases
    memory once none has been in flight for quiet_s."""

    def __init__(self, app, quiet_s: float = QUIET_S):
        self.app, self.quiet_s = app, quiet_s
        self._lock = threading.Lock()
        self._active = 0
        self._epoch = 0      # counts requests begun: a release timer sees whether one came since
        self.releases = 0    # memory releases done (tests read it)

    def __call__(self, environ, start_response):
        with self._lock:
            self._active += 1
            self._epoch += 1
        try:
            return ClosingIterator(self.app(environ, start_response), [self._done])
        except BaseException:
            self._done()
            raise

    def _done(self) -> None:
        with self._lock:
            self._active -= 1
            epoch = self._epoch if self._active == 0 else None
        if epoch is not None:   # quiet now: release once it has stayed so for quiet_s
            t = threading.Timer(self.quiet_s, self._release_if_quiet, args=(epoch,))
            t.daemon = True
            t.start()

    def _release_if_quiet(self, epoch: int) -> None:
        with self._lock:
            if self._active or self._epoch != epoch:   # a request came since: its own end re-arms
                return
        self.releases += 1
        release_memory()


def make_server(app, host: str, port: int, *, threads: int = THREADS, connection_limit: int = CONNECTION_LIMIT,
                channel_timeout_s: float = CHANNEL_TIMEOUT_S, cleanup_interval_s: float = CLEANUP_INTERVAL_S,
                quiet_s: float = QUIET_S):
    """A waitress server for a WSGI app (a Dash app's `.server`), bound now (OSError for a port in
    use); `.run()` serves until `.close()`. Its `.quiet` is the memory-release middleware."""
    from waitress.server import create_server
    quiet = QuietRelease(app, quiet_s)
    srv = create_server(quiet, host=host, port=port, threads=threads, connection_limit=connection_limit,
                        channel_timeout=channel_timeout_s, cleanup_interval=cleanup_interval_s,
                        max_request_header_size=MAX_HEADER_BYTES, max_request_body_size=MAX_BODY_BYTES,
                        ident="epscope", expose_tracebacks=False)
    srv.quiet = quiet
    return srv


# glibc mallopt parameter M_ARENA_MAX (malloc.h). With glibc's default (8 arenas per core) and
# no trimming, a 30 s flood of what-ifs (20 clients, benchmarks/bench_whatif_flood.py) left the
# server +50-57 % above its starting memory once idle; with 2 arenas and release_memory when the
# server goes quiet, +3 % and +9 % (two runs, load average 10; results/whatif-flood-*.md).
_M_ARENA_MAX = -8
MALLOC_ARENAS = 2


def limit_malloc_arenas(n: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas (True if set; False where the C library is not glibc)."""
    try:
        import ctypes
        return ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, n) == 1
    except (OSError, AttributeError):
        return False


# -- malformed requests --------------------------------------------------------------------------------
CALLBACK_PATH = "/_dash-update-component"
SUITES_RULE = "/_dash-component-suites/<string:package_name>/<path:fingerprinted_path>"


def _prop(x) -> bool:
    return isinstance(x, dict) and isinstance(x.get("property"), str) and isinstance(x.get("id"), (str, dict))


def _matches(sent, declared: dict) -> bool:
    """A sent input (or state) is the declared one: its id and property (a pattern-matching id, a
    dict, is sent as a list of matches)."""
    if isinstance(declared["id"], dict):
        return isinstance(sent, list) and all(_prop(x) for x in sent)
    return _prop(sent) and sent["id"] == str(declared["id"]) and sent["property"] == declared["property"]


def callback_body_problem(callback_map: dict, body: Any) -> str | None:
    """What is wrong with a callback request's JSON body (None: what Dash's renderer sends for one
    of the registered callbacks): its output names a callback, its outputs are as many as that
    callback's, its inputs and states are the callback's, in order; changedPropIds a list of names."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    cb = callback_map.get(body.get("output")) if isinstance(body.get("output"), str) else None
    if cb is None:
        return "its output names no callback"
    outs = body.get("outputs")
    n_out = len(cb.get("outputs_indices") or []) if isinstance(cb.get("outputs_indices"), list) else 1
    if not cb.get("no_output") and not ((isinstance(outs, dict) and n_out == 1 and _prop(outs)) or (
            isinstance(outs, list) and len(outs) == n_out and all(_prop(o) for o in outs))):
        return "its outputs are not the callback's"
    for key in ("inputs", "state"):
        sent, declared = body.get(key, []), cb.get(key) or []
        if not isinstance(sent, list) or len(sent) != len(declared) or not all(map(_matches, sent, declared)):
            return f"its {key} are not the callback's"
    changed = body.get("changedPropIds", [])
    if not isinstance(changed, list) or not all(isinstance(x, str) for x in changed):
        return "changedPropIds is not a list of names"
    return None


def install_request_checks(app) -> None:
    """Answer malformed framework requests of a Dash app with 4xx (never Dash's HTTP 500): a bad
    callback body 400, a component-suite path of no registered file 404."""
    import flask
    from dash.exceptions import DependencyException

    server = app.server

    @server.before_request
    def _callback_body():
        if flask.request.path != CALLBACK_PATH or flask.request.method != "POST":
            return None
        problem = callback_body_problem(app.callback_map, flask.request.get_json(silent=True))
        if problem is None:
            return None
        return flask.Response(f"epscope viewer: bad callback request: {problem}\n", status=400, mimetype="text/plain")

    view = server.view_functions[SUITES_RULE]

    def component_suites(*args, **kwargs):
        try:
            return view(*args, **kwargs)
        except (DependencyException, KeyError, ValueError, OSError, AttributeError):
            # not a registered package's file (or one that cannot be read): nothing to serve
            return flask.Response("epscope viewer: no such component file\n", status=404, mimetype="text/plain")
    server.view_functions[SUITES_RULE] = component_suites
