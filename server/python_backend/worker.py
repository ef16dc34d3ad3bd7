"""The server's side of one Python-backend worker process: start it, call it (one call at a time, each with a
timeout), read what it sends between calls (decoupled responses, BLS requests, log lines), and notice when it dies.

A reader thread owns the socket's input. Replies to the current call go to the caller's queue; everything else goes
to the handlers. When the process exits (a crash, os._exit, a kill), the reader sees the socket close: the call in
progress fails with the reason (the exit status or signal), and so does every later call until `start` runs again.
A call that gets no answer within its timeout kills the process, so a hung model fails its requests instead of
holding them forever.
"""

from __future__ import annotations

import logging
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from server.python_backend.ipc import Header, IpcError, Link, Tensor, encode_frame

log = logging.getLogger("nnserve.python")
REPLIES = ("done", "failed", "executed")
# How long a process that closed its socket (or was killed) gets to be reaped before it is killed outright.
REAP_SECONDS = 5.0
CLOSED = "was stopped (its model was unloaded)"
# How long a message that is not a call (a BLS answer, a cancel) may take to be written before the process is
# killed as one that stopped reading.
SEND_SECONDS = 60.0
# Frames up to this size are written without a timer (a Unix socket's buffer holds far more; see _send_within).
UNTIMED_FRAME_BYTES = 64 * 1024


class WorkerGone(Exception):
    """The worker process is not there to answer: it exited, was killed, or its link broke."""


class ModelFailed(Exception):
    """The model raised (or answered wrongly) in the call; the worker is still there."""


@dataclass
class Handlers:
    """What the worker sends between calls, each handled on the reader thread (so: quickly)."""

    response: Callable[[Header, list[Tensor]], None]
    bls: Callable[[Header, list[Tensor]], None]
    gone: Callable[[str], None]


class WorkerProcess:
    def __init__(self, label: str, model_file: Path, handlers: Handlers):
        self.label = label  # "model 'name' instance name_0_0": what messages call it
        self.model_file = model_file
        self.handlers = handlers
        self._proc: subprocess.Popen[bytes] | None = None
        self._link: Link | None = None
        self._replies: queue.Queue[tuple[Header, list[Tensor]] | None] = queue.Queue()
        self._call_lock = threading.Lock()
        self.gone: str | None = "not started"  # why it cannot answer; None while it runs

    def start(self) -> None:
        """A fresh process with the model file; nothing of the model runs until the first call."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "server.python_backend.stub", str(theirs.fileno()), str(self.model_file)],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except OSError as exc:
            ours.close()
            raise WorkerGone(f"{self.label}: cannot start a Python process: {exc}") from None
        finally:
            theirs.close()
        self._link = Link(ours)
        self._replies = queue.Queue()
        self.gone = None
        _STARTED.add(self)
        threading.Thread(target=self._read, args=(self._link, self._proc, self._replies),
                         name="nnserve-python-reader", daemon=True).start()

    @property
    def running(self) -> bool:
        return self.gone is None

    def call(self, header: Header, tensors: Iterable[Tensor] = (), timeout: float | None = None
             ) -> tuple[Header, list[Tensor]]:
        """Send a call and wait for its reply. ModelFailed: the model's error; WorkerGone: no worker (any more)."""
        with self._call_lock:
            if self.gone is not None or self._link is None:
                raise WorkerGone(f"{self.label}: the Python process is not running ({self.gone})")
            replies, started = self._replies, time.monotonic()
            try:
                self._send_within(self._link, header, tensors, timeout)
            except OSError as exc:
                if self.gone is not None:  # killed for not reading within the timeout: reaped, then said so
                    self.kill(self.gone)
                    raise WorkerGone(f"{self.label}: the Python process {self.gone}") from None
                raise WorkerGone(f"{self.label}: the Python process does not take calls any more ({exc})") from None
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
            try:
                reply = replies.get(timeout=left)
            except queue.Empty:
                self.kill(f"it did not answer '{header.get('kind')}' within {timeout:g} s (the model hangs?); "
                          "killed")
                raise WorkerGone(f"{self.label}: the Python process {self.gone}") from None
            if reply is None:
                raise WorkerGone(f"{self.label}: the Python process {self.gone}")
            if reply[0].get("kind") == "failed":
                raise ModelFailed(str(reply[0].get("error", "the model failed")))
            return reply

    def send(self, header: Header, tensors: Iterable[Tensor] = ()) -> None:
        """A message that is not a call (a BLS answer); dropped when the process is gone."""
        link = self._link
        if link is None or self.gone is not None:
            return
        try:
            self._send_within(link, header, tensors, SEND_SECONDS, call=False)
        except OSError:
            pass  # the reader sees the process go and says why

    def _send_within(self, link: Link, header: Header, tensors: Iterable[Tensor], timeout: float | None,
                     call: bool = True) -> None:
        """link.send, bounded: a process that stops reading (stopped, or stuck holding the GIL in C code) fills the
        socket's buffer and would block the sender forever, so past `timeout` it is killed, which fails the send.
        A call's small frame needs no timer: calls go one at a time and each is read whole before its reply, so
        the buffer holds no earlier call when one starts and a frame this small fits in it (messages outside
        calls, which may pile up behind a process that stopped reading, are always timed)."""
        pieces = encode_frame(header, tensors)
        if timeout is None or (call and sum(len(p) for p in pieces) <= UNTIMED_FRAME_BYTES):
            link.send_pieces(pieces)
            return
        why = (f"did not take '{header.get('kind')}' within {timeout:g} s (it stopped reading its link); killed")
        timer = threading.Timer(timeout, self.kill, args=(why,))
        timer.daemon = True
        timer.start()
        try:
            link.send_pieces(pieces)
        finally:
            timer.cancel()

    def kill(self, why: str) -> None:
        """Stop the process now (SIGKILL) and reap it; the reader then reports it gone with `why`."""
        proc = self._proc
        if self.gone is None:
            self.gone = why
        if proc is not None and proc.poll() is None:
            proc.kill()
            try:
                proc.wait(REAP_SECONDS)
            except subprocess.TimeoutExpired:
                log.error("%s: the Python process (pid %d) did not die of SIGKILL", self.label, proc.pid)

    def close(self, timeout: float) -> None:
        """finalize() (up to `timeout`), then make sure the process is gone and reaped."""
        if self.running:
            try:
                self.call({"kind": "finalize"}, timeout=timeout)
            except (WorkerGone, ModelFailed) as exc:
                log.warning("%s: finalize failed: %s", self.label, exc)
        self.kill(CLOSED)
        if self._proc is not None:
            try:
                self._proc.wait(REAP_SECONDS)
            except subprocess.TimeoutExpired:
                log.error("%s: the Python process (pid %d) did not exit", self.label, self._proc.pid)
        if self._link is not None:
            self._link.close()

    # ---- the reader thread ------------------------------------------------------------------------------------
    def _read(self, link: Link, proc: subprocess.Popen[bytes],
              replies: queue.Queue[tuple[Header, list[Tensor]] | None]) -> None:
        problem = ""
        try:
            while (frame := link.receive()) is not None:
                kind = frame[0].get("kind")
                if kind in REPLIES:
                    replies.put(frame)
                elif kind == "response":
                    self.handlers.response(*frame)
                elif kind == "bls":
                    self.handlers.bls(*frame)
                elif kind == "log":
                    _log_line(self.label, frame[0])
                else:
                    raise IpcError(f"an unknown message kind {kind!r}")
        except (OSError, IpcError) as exc:
            try:  # a process that died in the middle of a message (a crash) is reported by its exit status
                proc.wait(REAP_SECONDS)
            except subprocess.TimeoutExpired:
                problem = f"broke the link protocol ({exc}); killed"
                proc.kill()
        except Exception:  # a bug in a handler: the worker cannot be trusted to be in step any more
            log.exception("%s: handling a message from the Python process failed", self.label)
            problem = "sent a message the server could not handle; killed"
            proc.kill()
        current = self._link is link  # not a process already replaced by a restart
        status = _exit_reason(proc)  # reaps it, whatever happened
        why = (self.gone if current else None) or problem or status
        replies.put(None)
        if not current:
            return
        self.gone = why
        if why != CLOSED:
            log.error("%s: the Python process %s", self.label, why)
        self.handlers.gone(why)


def _exit_reason(proc: subprocess.Popen[bytes]) -> str:
    try:
        code = proc.wait(REAP_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "closed its link without exiting; killed"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


_LEVELS = {"INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR, "VERBOSE": logging.DEBUG}


def _log_line(label: str, header: Header) -> None:
    log.log(_LEVELS.get(str(header.get("level")), logging.INFO), "%s: %s", label, header.get("message", ""))


# Every worker started (weakly: a closed one goes with its model), for kill_all.
_STARTED: weakref.WeakSet[WorkerProcess] = weakref.WeakSet()


def kill_all(why: str) -> None:
    """Kill every Python process still running: the server exits without waiting for a stuck load (its thread
    cannot be stopped), and a process whose initialize() hangs must not outlive it."""
    for worker in list(_STARTED):
        worker.kill(why)
