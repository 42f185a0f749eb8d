"""One session of the Udacity bridge: the bridge behind its Socket.IO server until Ctrl-C (or
the simulator disconnects, where asked), then the run's summary.

:mod:`~nac_drive.simulators.udacity_bridge` is what to answer,
:mod:`~nac_drive.simulators.udacity_server` the server that answers; this module puts one in
the other, after checking the server's libraries (the ``udacity`` extra) are there.
"""

from __future__ import annotations

import sys

from nac_drive.io import strict_json
from nac_drive.simulators.udacity_bridge import MissingUdacityExtra, UdacityBridge


def require_udacity_extra():
    """The socket server's ``serve`` (the ``udacity`` extra); raises :class:`MissingUdacityExtra`
    without it. Called before anything is made: no folder, no summary of a run that never starts."""
    try:
        from nac_drive.simulators.udacity_server import serve
    except ImportError as e:
        raise MissingUdacityExtra(str(e)) from None
    return serve


def _run(bridge: UdacityBridge, serve, host: str, port: int, json_out: bool, exit_on_disconnect: bool,
         report=None) -> int:
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)

    def ready(p):
        print(f"udacity bridge listening on {host}:{p} "
              f"({'driving' if bridge.policy is not None else 'passing manual driving through'}"
              f"{', recording to ' + str(bridge.writer.out_dir) if bridge.writer else ''})",
              file=sys.stderr, flush=True)
        if not _loopback(host):
            print(f"udacity bridge: {host} is not this machine's loopback address: any machine that reaches it "
                  "can take the seat and drive the car, or feed the recording", file=sys.stderr, flush=True)

    try:
        serve(bridge, host, port, exit_on_disconnect, ready=ready)
    finally:
        bridge.close()
        summary = {**bridge.stats.summary(), **(report() if report is not None else {})}
        if json_out:   # strict, as every verb's --json line
            print(strict_json.dumps(summary), flush=True)
        else:
            print("udacity bridge summary:", flush=True)
            for k, v in summary.items():
                print(f"  {k}: {v}", flush=True)
    return 0


def drive_udacity(policy, host: str = "127.0.0.1", port: int = 4567, speed: float = 9.0,
                  record_dir=None, json_out: bool = False, exit_on_disconnect: bool = False, report=None) -> int:
    """Drive the simulator with ``policy`` (an actor: ``reset()`` + ``act(obs)``) until
    Ctrl-C; print the summary (one JSON line with ``json_out``), with what ``report()``, if
    given, adds at the end (the driver's frames dropped). Returns an exit code."""
    serve = require_udacity_extra()
    return _run(UdacityBridge(policy, speed, record_dir), serve, host, port, json_out, exit_on_disconnect, report)


def record_udacity(out_dir, host: str = "127.0.0.1", port: int = 4567, json_out: bool = False,
                   exit_on_disconnect: bool = False) -> int:
    """Record a human's driving (pass-through: answers ``manual``) to ``out_dir``."""
    serve = require_udacity_extra()
    return _run(UdacityBridge(None, record_dir=out_dir), serve, host, port, json_out, exit_on_disconnect)


def _loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is only reachable from this machine."""
    import ipaddress
    import socket

    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False
