"""A raw websocket server that records, byte for byte, what a Udacity client sends.

Usage: python capture_server.py PORT MODE, MODE = "strings" (answers every telemetry with a
steer whose values are strings, after 20 ms) or "numbers" (answers with JSON numbers, which
the Unity simulator cannot parse). Prints "listening", then one JSON line per event:
{"path": ..., "query": ...} on connect, {"frame": <text>} for each received frame and
{"closed": true} when the client closes; then it exits (it serves one connection).
"""

import json
import os
import signal
import sys
import time
import warnings


def _exit_now(signum, frame):
    # Not KeyboardInterrupt: eventlet's server then waits for every open connection to end,
    # and a client that has not closed yet kept it (and the test) waiting. Every event is
    # already printed and flushed. Set explicitly, the handler also works when a
    # non-interactive background shell starts this with SIGINT ignored.
    os._exit(0)


signal.signal(signal.SIGINT, _exit_now)
warnings.filterwarnings("ignore")
import eventlet  # noqa: E402
import eventlet.websocket  # noqa: E402
import eventlet.wsgi  # noqa: E402

MODE = sys.argv[2]


@eventlet.websocket.WebSocketWSGI
def handle(ws):
    env = ws.environ
    print(json.dumps({"path": env.get("PATH_INFO"), "query": env.get("QUERY_STRING")}), flush=True)
    ws.send('0{"sid":"abc","upgrades":[],"pingInterval":25000,"pingTimeout":60000}')
    while True:
        frame = ws.wait()
        if frame is None:  # the client closed: every frame it sent is printed above
            print(json.dumps({"closed": True}), flush=True)
            os._exit(0)
        print(json.dumps({"frame": frame}), flush=True)
        if frame == "2":
            ws.send("3")
        elif frame.startswith('42["telemetry"'):
            time.sleep(0.02)
            value = "0.1" if MODE == "strings" else 0.1
            ws.send("42" + json.dumps(["steer", {"steering_angle": value, "throttle": value}]))


def app(environ, start_response):
    if environ.get("HTTP_UPGRADE", "").lower() == "websocket":
        return handle(environ, start_response)
    start_response("400 Bad Request", [("Content-Type", "text/plain")])
    return [b"websocket only"]


listener = eventlet.listen(("127.0.0.1", int(sys.argv[1])))
print("listening", file=sys.stderr, flush=True)
eventlet.wsgi.server(listener, app, log_output=False)
