"""The HTTP server `epscope view` runs: werkzeug's threaded server (what Dash's app.run starts),
with the bounds it lacks (issue 19: 20 clients for 60 s grew the server from 405 MB to 1.7 GB,
a thread per connection, idle connections kept forever):

  * at most MAX_CONNECTIONS connections are served at once (a thread each); one more is
    answered at once with HTTP 503 and a one-line "busy" body, by a small bounded set of
    threads (MAX_BUSY_REPLIES; past that the connection is closed unanswered);
  * a connection that sends nothing for IDLE_TIMEOUT_S is closed (socket timeout: a
    keep-alive connection left open, or a client that stops mid-request, frees its thread);
  * glibc's malloc keeps at most MALLOC_ARENAS arenas (`limit_malloc_arenas`, called before any
    thread starts): with one arena per busy thread (up to 8 per core), memory a flood's threads
    freed stayed in their arenas;
  * what the requests freed goes back to the system (jobs.release_memory) once the server has been
    quiet for QUIET_S, not at each moment its last connection closes: a page load has several such
    moments, and each release (a full gc.collect holding the GIL) took 0.1-0.5 s, 1.5 s in all on
    one cold page of a 10 k-event run (load 2.8; benchmarks/NOTES.md, "cold pages round 2").
"""
from __future__ import annotations

import socket
import threading

from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler

from .jobs import release_memory

# A browser opens up to 6 connections to one host (Chromium's per-host limit); 32 serves a few
# people at once while capping threads (each holds up to a page's response in memory).
MAX_CONNECTIONS = 32
MAX_BUSY_REPLIES = 4
# Dash's polls come every 0.4 s and a page's callbacks within a second; a connection quiet for
# 15 s belongs to a closed tab or a stalled client.
IDLE_TIMEOUT_S = 15.0
# A page's requests come in bursts a few hundred ms apart (scripts, layout, callbacks, plotly.js);
# a second without a connection is the page done.
QUIET_S = 1.0
BUSY_BODY = b"epscope viewer: busy (too many connections at once); try again in a moment\n"
BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                 b"Retry-After: 1\r\nConnection: close\r\nContent-Length: " + str(len(BUSY_BODY)).encode()
                 + b"\r\n\r\n" + BUSY_BODY)


class _Handler(WSGIRequestHandler):
    timeout = IDLE_TIMEOUT_S   # socketserver.StreamRequestHandler sets it on the connection


class BoundedServer(ThreadedWSGIServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, app, *, max_connections: int = MAX_CONNECTIONS,
                 idle_timeout_s: float = IDLE_TIMEOUT_S, quiet_s: float = QUIET_S):
        handler = type("Handler", (_Handler,), {"timeout": idle_timeout_s})
        super().__init__(host, port, app, handler=handler)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._busy = threading.BoundedSemaphore(MAX_BUSY_REPLIES)
        self.refused = 0   # connections answered "busy" (tests and the benchmark read it)
        self._active = 0
        self._count_lock = threading.Lock()
        self.quiet_s = quiet_s
        self._epoch = 0      # counts connections opened: a release timer sees whether one came since
        self.releases = 0    # memory releases done (tests read it)

    def process_request(self, request, client_address):
        if self._slots.acquire(blocking=False):
            try:
                super().process_request(request, client_address)
            except BaseException:
                self._slots.release()
                raise
            return
        self.refused += 1
        if self._busy.acquire(blocking=False):
            threading.Thread(target=self._answer_busy, args=(request,), daemon=True).start()
        else:
            self.shutdown_request(request)

    def process_request_thread(self, request, client_address):
        with self._count_lock:
            self._active += 1
            self._epoch += 1
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
            with self._count_lock:
                self._active -= 1
                epoch = self._epoch if self._active == 0 else None
            if epoch is not None:   # the server goes quiet: release once it has stayed so for quiet_s
                t = threading.Timer(self.quiet_s, self._release_if_quiet, args=(epoch,))
                t.daemon = True
                t.start()

    def _release_if_quiet(self, epoch: int) -> None:
        with self._count_lock:
            if self._active or self._epoch != epoch:   # a connection came since: its own end re-arms
                return
        self.releases += 1
        release_memory()

    def _answer_busy(self, request) -> None:
        try:
            request.settimeout(1.0)
            try:
                request.recv(65536)   # the request line and headers: closing with them unread would reset
            except (socket.timeout, OSError):
                pass
            request.sendall(BUSY_RESPONSE)
        except OSError:
            pass
        finally:
            self.shutdown_request(request)
            self._busy.release()


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


def make_server(app, host: str, port: int, **kw) -> BoundedServer:
    """The bounded server for a WSGI app (a Dash app's `.server`); OSError for a port in use."""
    return BoundedServer(host, port, app, **kw)
