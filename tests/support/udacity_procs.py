"""Helpers for the Udacity tests: free ports, bridge processes and a raw Socket.IO client on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A subprocess whose stderr is drained in a thread; ``wait_for`` watches it."""

    def __init__(self, argv: list[str], env: dict | None = None, max_open_files: int | None = None):
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
            [str(SUPPORT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        full_env.update(env or {})
        if max_open_files is not None:  # by the shell: a preexec_fn fork warns once eventlet is imported
            argv = ["sh", "-c", f'ulimit -n {int(max_open_files)} && exec "$@"', "sh", *argv]
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
        self.err: list[str] = []
        self.out: list[str] = []
        self._drains = [threading.Thread(target=self._drain, args=(stream, sink), daemon=True)
                        for stream, sink in ((self.p.stderr, self.err), (self.p.stdout, self.out))]
        for thread in self._drains:
            thread.start()

    @staticmethod
    def _drain(stream, sink):
        for line in stream:
            sink.append(line)

    def wait_for(self, text: str, timeout: float = 30.0, stream: str = "err", count: int = 1) -> None:
        sink = self.err if stream == "err" else self.out
        end = time.time() + timeout
        while time.time() < end:
            if sum(text in line for line in list(sink)) >= count:
                return
            if self.p.poll() is not None:   # it ended: its last lines may still be in the pipe
                for thread in self._drains:
                    thread.join(5.0)
                if sum(text in line for line in list(sink)) >= count:
                    return
                break
            time.sleep(0.05)
        raise RuntimeError(f"{text!r} not seen (exit {self.p.poll()}):\n{''.join(self.err)[-3000:]}")

    def stop(self, sig=signal.SIGINT, timeout: float = 20.0) -> int:
        """Send ``sig`` (unless it already ended), wait for the exit and for the last lines of
        its output; if it does not end, kill it (never leave a server behind) and raise with
        what the kernel says of it."""
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            state = self._kernel_state()
            self.p.kill()
            self.p.wait()
            raise RuntimeError(f"pid {self.p.pid} did not exit within {timeout} s of {signal.Signals(sig).name}; "
                               f"{state}\nstderr: {''.join(self.err)[-2000:]}") from None
        for thread in self._drains:  # both pipes are at end of file once the process is gone
            thread.join(5.0)
        return rc

    def _kernel_state(self) -> str:
        """The process's run state, pending and blocked signals, and the call it sleeps in."""
        try:
            status = Path(f"/proc/{self.p.pid}/status").read_text().splitlines()
            wchan = Path(f"/proc/{self.p.pid}/wchan").read_text()
        except OSError as e:
            return f"no /proc entry ({e})"
        keep = ("State", "Threads", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
        return " ".join(line.replace("\t", "") for line in status if line.startswith(keep)) + f" wchan:{wchan}"

    def json_summary(self) -> dict:
        for line in reversed(self.out):
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
        raise AssertionError(f"no JSON summary in stdout: {self.out!r}\nstderr: {''.join(self.err)[-3000:]}")


def start_bridge(port: int, policy: str | None, record: str | None = None, extra: list[str] = (),
                 max_open_files: int | None = None) -> Proc:
    """Start the bridge (``bridge_main.py``: a test policy by name) and wait until it listens
    (``max_open_files``: its file descriptor limit)."""
    argv = [sys.executable, str(SUPPORT / "bridge_main.py"), "--port", str(port), "--json"]
    if policy:
        argv += ["--policy", policy]
    if record:
        argv += ["--record", record]
    proc = Proc(argv + list(extra), max_open_files=max_open_files)
    proc.wait_for("listening on")
    return proc


def websocket_url(port: int) -> str:
    """Where the Unity client connects."""
    return f"ws://127.0.0.1:{port}/socket.io/?EIO=4&transport=websocket"


class SocketIOClient:
    """A Unity-style Socket.IO client on a plain websocket: ``ask`` sends one telemetry
    and returns the event that answers it, as ``[name, data]``."""

    def __init__(self, port: int, timeout: float = 10.0):
        import websocket

        self.ws = websocket.create_connection(websocket_url(port), timeout=timeout)
        opening = self.ws.recv()
        assert opening.startswith("0"), opening
        self.sid = json.loads(opening[1:])["sid"]

    def next_event(self) -> list:
        while True:
            msg = self.ws.recv()
            if msg.startswith("42"):
                return json.loads(msg[2:])

    def ask(self, data) -> list:
        from nac_drive.simulators.udacity_emulator import event_packet

        self.ws.send(event_packet("telemetry", data))
        return self.next_event()

    def close(self) -> None:
        self.ws.close()


def start_recorder(port: int, out: str) -> Proc:
    """``nac-drive collect udacity`` (a human drives) as a subprocess (the CLI users run)."""
    proc = Proc([sys.executable, "-m", "nac_drive.cli", "collect", "udacity", "--out", out, "--port", str(port),
                 "--json"])
    proc.wait_for("listening on")
    return proc
