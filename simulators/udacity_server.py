"""The Udacity bridge's network side: the Socket.IO server the simulator connects to,
built so that hostile or broken clients cannot stall it, exhaust it or read its errors.

python-socketio 4.6 / python-engineio 3.13 on eventlet's WSGI server (the ``udacity``
extra; :mod:`nac_drive.simulators.udacity_bridge` says why those versions). The protocol
logic (what to answer) is :class:`~nac_drive.simulators.udacity_bridge.UdacityBridge`;
it lets one connection drive at a time and refuses the others. Limits of this server:

- one Engine.IO message, on either transport (a websocket message however many fragments
  it comes in, or a polling POST), is at most ``MAX_MESSAGE_BYTES``; a telemetry is
  ~20-50 kB. A larger one is refused before it is buffered: a websocket is closed (1009),
  a POST answered 413;
- a connection that sends no request for ``IDLE_TIMEOUT_S`` is closed, and so is one that
  stalls ``IO_TIMEOUT_S`` inside a request (a half-sent request opens no session: it never
  holds the seat). The seat: a session that drives but has sent no telemetry
  ``IDLE_TIMEOUT_S`` after connecting (a handshake that vanished, a silent websocket) is
  dropped (a websocket closed 1008) and the seat is free; the simulator sends its first
  telemetry on connect. A driver that has sent telemetry keeps the seat while its
  connection lives: engineio's ping timeout (60 s; the simulator pings every 25 s) ends a
  silent one. A message engineio cannot decode closes its websocket (1007) and frees the
  seat at once (:class:`_CheckedWebSocket`). At most ``MAX_CONNECTIONS`` at once, fewer when
  the process may open fewer files: eventlet's accept loop dies when it runs out of file
  descriptors, and the bridge would stop listening for good;
- errors never reach a client (eventlet's debug mode, which sends tracebacks, is off);
- client events named ``connect`` or ``disconnect`` (python-socketio 4 would run the
  connection handlers for them) and binary packets (the simulator sends none, and the
  attachments a binary packet announces pile up without limit) are dropped;
- a ``transport=websocket`` handshake without a websocket upgrade is answered 400:
  engineio would open a session for it that can never send anything yet drives;
- a browser page cannot connect from another origin (engineio's default Origin check).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
import urllib.parse
import warnings
from importlib.metadata import version

import numpy as np

warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
import eventlet  # noqa: E402
import eventlet.event  # noqa: E402
import eventlet.websocket as ews  # noqa: E402
import eventlet.wsgi  # noqa: E402
import socketio  # noqa: E402
from engineio import packet as engineio_packet  # noqa: E402
from engineio.async_drivers import eventlet as engineio_eventlet  # noqa: E402

from nac_drive.io import bounded_json  # noqa: E402
from nac_drive.simulators.udacity_bridge import Busy, UdacityBridge  # noqa: E402

if int(version("python-socketio").split(".")[0]) >= 5:   # the bridge reports it as a missing extra
    raise ImportError(f"python-socketio {version('python-socketio')} cannot talk to the Udacity simulator "
                      "(it needs 4.x)")

log = logging.getLogger("nac_drive.udacity_bridge")

MAX_MESSAGE_BYTES = 1 << 20
IDLE_TIMEOUT_S = 5.0
IO_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 1024  # eventlet's default; the simulator needs one
FD_RESERVE = 32  # file descriptors kept free of connections (recording, logging, the event hub)
RESERVED_EVENTS = ("connect", "disconnect")


def _apply_mask_numpy(data, mask, length=None, offset=0):
    """XOR websocket payload bytes with the 4-byte client mask (vectorised)."""
    n = len(data) if length is None else length
    key = np.roll(np.frombuffer(bytes(mask), np.uint8), -(offset % 4))
    return (np.frombuffer(data, np.uint8, count=n) ^ np.tile(key, n // 4 + 1)[:n]).tobytes()


class _CappedMessage(ews.RFC6455WebSocket.Message):
    """A websocket message that ends the connection (close 1009) once its fragments
    together exceed ``max_frame_length``: eventlet checks each frame, not their sum."""

    size = 0

    def push(self, data, final=False):
        self.size += len(data)
        if self.size > self.max_frame_length:
            raise ews.FailedConnectionError(1009, f"message above the limit of {self.max_frame_length} bytes")
        super().push(data, final)


def _patch_eventlet_websocket() -> None:
    """Two changes to eventlet's websocket in this process. Unmasking: eventlet unmasks every
    client frame byte by byte in Python, ~5 ms for one 15 kB telemetry frame (more than the
    whole decode + policy step); numpy does the same XOR (checked against RFC 6455 in the
    tests). Messages: capped over all their fragments (:class:`_CappedMessage`)."""
    ews.RFC6455WebSocket._apply_mask = staticmethod(_apply_mask_numpy)
    ews.RFC6455WebSocket.Message = _CappedMessage


class _CheckedWebSocket:
    """An Engine.IO websocket whose ``wait`` returns only messages engineio can decode.

    engineio 3.13 decodes a message outside its error handling: a text message whose first
    character is not ASCII (``"é42"``), a ``b`` packet with bad base64, or a binary one
    whose tail is not UTF-8 raised out of its reader, which then never ran the disconnect
    handler, and the connection kept the seat for engineio's 60 s ping timeout. Such a
    message closes its connection here (1007, invalid payload): engineio sees a closed
    websocket and disconnects the session at once."""

    def __init__(self, ws, warn_once):
        self._ws, self._warn_once = ws, warn_once

    def __getattr__(self, name):  # send, close, socket, ...: the websocket's own
        return getattr(self._ws, name)

    def wait(self):
        message = self._ws.wait()
        if message is None:
            return None
        try:
            engineio_packet.Packet(encoded_packet=message)
        except Exception as e:
            self._warn_once("undecodable_message", f"closed a connection that sent a message engineio cannot "
                                                   f"decode ({type(e).__name__})")
            self.close(close_data=(1007, "not an Engine.IO packet"))
            return None
        return message


class _Websockets:
    """engineio's websocket transport for this server: frames and messages capped at
    ``MAX_MESSAGE_BYTES``, undecodable messages refused (:class:`_CheckedWebSocket`), and
    each open websocket known by its session id, so that :meth:`close` can end one."""

    def __init__(self, warn_once):
        self._warn_once = warn_once
        self.open: dict[str, object] = {}

    def __call__(self, handler):  # handler: the engineio Socket's _websocket_handler
        sid = handler.__self__.sid

        def checked_handler(ws):
            ws = _CheckedWebSocket(ws, self._warn_once)
            self.open[sid] = ws
            try:
                return handler(ws)
            finally:
                if self.open.get(sid) is ws:
                    del self.open[sid]

        return engineio_eventlet.WebSocketWSGI(checked_handler, max_frame_length=MAX_MESSAGE_BYTES)

    def close(self, sid: str, code: int, reason: str) -> None:
        ws = self.open.pop(sid, None)
        if ws is not None:
            try:
                ws.close(close_data=(code, reason))
            except OSError:
                pass


class _BridgeSocketIO(socketio.Server):
    """python-socketio 4.6 without the client inputs the bridge does not take (module
    docstring): events named ``connect``/``disconnect`` and binary packets."""

    def __init__(self, warn_once, **kwargs):
        super().__init__(**kwargs)
        self._warn_once = warn_once

    def _handle_eio_message(self, sid, data):
        if not isinstance(data, str) or data[:1] in ("5", "6"):  # Socket.IO BINARY_EVENT / BINARY_ACK
            self._warn_once("binary_packet", f"dropped a binary packet from {sid}")
            return
        if not bounded_json.within_depth(data):   # json.loads would recurse into a RecursionError
            self._warn_once("deep_packet", f"dropped a packet nested deeper than {bounded_json.MAX_DEPTH} from {sid}")
            return
        super()._handle_eio_message(sid, data)

    def _handle_event(self, sid, namespace, id, data):
        if data and data[0] in RESERVED_EVENTS:
            self._warn_once("reserved_event", f"dropped a client event named {data[0]!r} from {sid}")
            return
        super()._handle_event(sid, namespace, id, data)


def _post_too_large(environ) -> bool:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return True
    return not 0 <= length <= MAX_MESSAGE_BYTES


def _guarded(app, warn_once):
    """The WSGI app, answering two kinds of requests itself, and logging (once per kind)
    the errors eventlet then answers with a bare 500.

    A POST over ``MAX_MESSAGE_BYTES`` gets 413 before engineio sees it: engineio's own
    check (``max_http_buffer_size``) then closes the session waiting for a poll that never
    comes, which hangs that request for good. A websocket handshake that is no websocket
    upgrade gets 400 (module docstring)."""

    def guarded_app(environ, start_response):
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
        if environ.get("REQUEST_METHOD") == "POST" and _post_too_large(environ):
            start_response("413 Payload Too Large", [("Content-Type", "text/plain")])
            return [f"at most {MAX_MESSAGE_BYTES} bytes a message\n".encode()]
        if (query.get("transport", [""])[0] == "websocket" and "sid" not in query
                and environ.get("HTTP_UPGRADE", "").lower() != "websocket"):
            start_response("400 Bad Request", [("Content-Type", "text/plain")])
            return [b"transport=websocket needs a websocket upgrade\n"]
        try:
            return app(environ, start_response)
        except Exception as e:
            warn_once(f"http_{type(e).__name__}", f"HTTP request failed ({type(e).__name__}: {e}); "
                                                 "the client gets a bare 500")
            raise

    return guarded_app


def connection_limit() -> int:
    """How many connections the server holds at once: ``MAX_CONNECTIONS``, or fewer so that
    accepting them never runs the process out of file descriptors."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return MAX_CONNECTIONS
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    in_use = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 64
    return max(4, min(MAX_CONNECTIONS, soft - in_use - FD_RESERVE))


def serve(bridge: UdacityBridge, host: str = "127.0.0.1", port: int = 4567,
          exit_on_disconnect: bool = False, ready=None) -> None:
    """Run the Socket.IO server until Ctrl-C / SIGTERM (or the driver's first disconnect
    when ``exit_on_disconnect``). ``ready(port)`` is called once the socket listens."""
    # our own log lines only: the socket libraries log every packet at INFO
    logging.getLogger("socketio").setLevel(logging.WARNING)
    logging.getLogger("engineio").setLevel(logging.WARNING)

    _patch_eventlet_websocket()
    # async_handlers=False: telemetry is handled in arrival order on the connection's reader,
    # never by two green threads at once (the policy is stateful).
    sio = _BridgeSocketIO(bridge.warn_once, async_mode="eventlet", async_handlers=False, logger=False,
                          engineio_logger=False, max_http_buffer_size=MAX_MESSAGE_BYTES)
    # engineio keeps its async helpers in one dict shared by all servers: this one gets its
    # own copy, whose websocket caps frames (and, patched above, messages) at the same size
    websockets = _Websockets(bridge.warn_once)
    sio.eio._async = dict(sio.eio._async, websocket=websockets)
    stop = eventlet.event.Event()

    def _unseat_if_silent(sid):
        """The seat goes back when its connection has sent no telemetry ``IDLE_TIMEOUT_S``
        after taking it (a handshake that vanished, a websocket that says nothing)."""
        if not bridge.seated_without_telemetry(sid):
            return
        bridge.warn_once("silent_driver", f"dropped {sid}: no telemetry {IDLE_TIMEOUT_S:g} s after connecting")
        session = sio.eio.sockets.pop(sid, None)
        if session is not None:
            session.close(wait=False, abort=True)   # runs the disconnect handler: the seat is free
        websockets.close(sid, 1008, "no telemetry")
        _disconnect(sid)                           # in case engineio had already let the session go

    @sio.on("connect")
    def _connect(sid, environ):
        try:
            answer = bridge.on_connect(sid)
        except Busy:
            return False
        if answer is not None:
            log.info("simulator connected (%s)", sid)
            eventlet.spawn_after(IDLE_TIMEOUT_S, _unseat_if_silent, sid)
            sio.emit(*answer, room=sid)

    @sio.on("telemetry")
    def _telemetry(sid, data=None):
        arrived = time.monotonic()
        event, payload = bridge.on_telemetry(data, arrived)
        sio.emit(event, payload, room=sid)
        bridge.stats.latency_ms.append((time.monotonic() - arrived) * 1000)

    @sio.on("disconnect")
    def _disconnect(sid):
        if not bridge.on_disconnect(sid):
            return
        s = bridge.stats
        print(f"simulator disconnected: {s.messages} telemetry, {s.answered} answered, {s.malformed} malformed, "
              f"{s.rows_recorded} rows recorded so far", file=sys.stderr, flush=True)
        if exit_on_disconnect and not stop.ready():
            stop.send()

    app = _guarded(socketio.WSGIApp(sio), bridge.warn_once)
    listener = eventlet.listen((host, port))
    # no Nagle delay for the small steer messages (accepted sockets inherit it on Linux)
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    server = eventlet.spawn(eventlet.wsgi.server, listener, app, log_output=False, debug=False,
                            keepalive=IDLE_TIMEOUT_S, socket_timeout=IO_TIMEOUT_S, max_size=connection_limit())

    # Ctrl-C / SIGTERM only set a flag: an exception raised by a signal handler would land
    # in whichever green thread happens to run (possibly the server's) instead of here.
    signalled = []

    def _terminate(signum, frame):
        signalled.append(signum)

    previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGINT, signal.SIGTERM)}
    if ready is not None:
        ready(listener.getsockname()[1])
    try:
        while not signalled and not stop.ready() and not server.dead:
            eventlet.sleep(0.05)
        if server.dead and not signalled and not stop.ready():
            try:
                server.wait()
                why = "it returned"
            except Exception as e:
                why = f"{type(e).__name__}: {e}"
            raise SystemExit(f"udacity bridge: the server stopped listening ({why})")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.kill()
        listener.close()
