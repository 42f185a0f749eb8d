"""A drive.py-style Udacity server on python-socketio 5.x (run with the side venv's python).

Used by tests/test_udacity_sio5.py to show that the simulator's Unity client does not
work with python-socketio >= 5. Usage: python sio5_server.py PORT. Prints one JSON line
``{"telemetry": N, "connects": M}`` when terminated (SIGTERM) and "listening" at start.
"""

import json
import os
import signal
import sys
import warnings

warnings.filterwarnings("ignore")
import eventlet  # noqa: E402
import eventlet.wsgi  # noqa: E402
import socketio  # noqa: E402

from importlib.metadata import version  # noqa: E402

counts = {"telemetry": 0, "connects": 0, "socketio_major": int(version("python-socketio").split(".")[0])}
sio = socketio.Server(async_mode="eventlet")


@sio.on("connect")
def connect(sid, environ):
    counts["connects"] += 1
    sio.emit("steer", {"steering_angle": "0", "throttle": "0"}, to=sid)


@sio.on("telemetry")
def telemetry(sid, data):
    counts["telemetry"] += 1
    sio.emit("steer", {"steering_angle": "0.0", "throttle": "0.2"}, to=sid)


def stop(*_):
    print(json.dumps(counts), flush=True)
    # sys.exit here raises in whichever green thread is running, which eventlet may swallow
    # (the server then outlives the test's wait); nothing is left to clean up, so leave now.
    os._exit(0)


signal.signal(signal.SIGTERM, stop)
listener = eventlet.listen(("127.0.0.1", int(sys.argv[1])))
print("listening", flush=True)
eventlet.wsgi.server(listener, socketio.WSGIApp(sio), log_output=False)
