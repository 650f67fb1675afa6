#!/usr/bin/env python3
"""A stand-in for NVIDIA's MPS control daemon (nvidia-cuda-mps-control) on machines without a GPU.

It is a STAND-IN: no GPU, no CUDA, no NVIDIA binary. It speaks enough of the control interface for gpupack's
agent and models what the node side depends on. Python standard library only, one file, so the image build
can add it for tests (`deploy/image/build.sh --standins` installs it as
/opt/gpupack-standin/nvidia-cuda-mps-control) and tests can run it from the checkout.

Modes (the first three are nvidia-cuda-mps-control's own):
  mps_control.py -d [-M]      start the control daemon in the background and return once it answers
  mps_control.py -f [-M]      run the control daemon in the foreground (what a daemon pod runs)
  mps_control.py              control client: one command per stdin line, each answer on stdout; exit 1
                              if the daemon cannot be reached or refused a command
  mps_control.py client [--hold] [--timeout S]
                              a stand-in CUDA client: attaches to a server (the daemon picks or starts one
                              for the caller's uid) and prints `server <pid> uid <uid>`; with --hold it
                              keeps the connection (a long-lived CUDA context) until SIGTERM (exit 0) or
                              until the daemon or its server goes away (prints `lost server <pid>`, exit 1).
                              No answer within --timeout S (default 30): prints `waiting`, exit 4. No
                              daemon: prints `no MPS daemon`, exit 3 (a real client would run without MPS).
  `-M` (also `--multiuser-server`): one server, run as root, serves clients of every uid at once.

Environment: CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps; the control socket is `<dir>/control`),
CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps; the daemon appends to `control.log` there).

Control commands answered (names and arguments as nvidia-cuda-mps-control documents them):
  get_server_list                         server pids, one a line
  get_client_list <server pid>            that server's client pids, one a line
  start_server -uid <uid>                 start a server for uid (refused while another uid's server runs)
  shutdown_server <pid> [-f]              stop a server once its clients are gone (-f: now, dropping them)
  set_default_active_thread_percentage <1..100> / get_default_active_thread_percentage
  set_default_device_pinned_mem_limit <ordinal|uuid> <N[K|M|G]> / get_default_device_pinned_mem_limit <dev>
  quit [-t <seconds>]                     stop every server and the daemon
Stand-in only (no NVIDIA equivalent; for tests): `get_client_uid <client pid>`, `get_server_uid <pid>`.

What it models:
- A client is identified by the pid in its socket's peer credentials (SO_PEERCRED), as memory accounting
  does: seen from a daemon outside the client's pid namespace without hostPID, that pid is 0.
- One server per uid without -M (a real forked process, run as that uid when the daemon is root): a client of
  another uid waits until every client of the running server has gone, then the daemon replaces the server
  (NVIDIA's "serialized exclusive access of the GPU between users"). With -M one root server serves all.
- A client's connection is long-lived; it ends when the client exits, its server is shut down or the
  daemon quits. The daemon's lifetime is its own: nothing here ends when a control client disconnects.
What it does not model: GPUs, device ordinals beyond storing the defaults, memory or thread limits being
enforced, the control protocol's wire format (the control client here is this same program).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_PIPE = "/tmp/nvidia-mps"
DEFAULT_LOG = "/var/log/nvidia-mps"
CLIENT_HELLO = "gpupack-standin-client"  # the first line a stand-in CUDA client sends
OK, ERR = "0", "1"  # status line of every control answer (the stand-in's own framing)


def pipe_dir() -> Path:
    return Path(os.environ.get(PIPE_ENV) or DEFAULT_PIPE)


def control_path() -> Path:
    return pipe_dir() / "control"


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a unix socket, as the kernel records them."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


@dataclass(eq=False)
class Server:
    """One MPS server: a real child process (`ps` shows it), and the connections of its clients."""

    uid: int
    pid: int
    clients: dict[int, socket.socket] = field(default_factory=dict)  # client pid -> its connection
    draining: bool = False  # no new clients; it exits once its clients are gone


class Daemon:
    """The control daemon: accepts control commands and client attachments on `<pipe>/control`."""

    def __init__(self, multiuser: bool) -> None:
        self.multiuser = multiuser
        self.lock = threading.Condition()
        self.servers: list[Server] = []
        self.client_uids: dict[int, int] = {}
        self.thread_percentage = "100.0"
        self.pinned_limits: dict[str, str] = {}
        self.stopping = threading.Event()
        self.log_path = Path(os.environ.get(LOG_ENV) or DEFAULT_LOG) / "control.log"
        self.listener: socket.socket | None = None

    def log(self, message: str) -> None:
        line = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}\n"
        with contextlib.suppress(OSError):
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a") as f:
                f.write(line)

    # --- lifecycle ---

    def serve(self) -> None:
        path = control_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a socket file left by a daemon that died
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        os.chmod(path, 0o777)  # clients of every uid must reach it
        listener.listen(64)
        self.listener = listener
        self.log(f"Startup (stand-in, multiuser={self.multiuser}, pid {os.getpid()})")
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: threading.Thread(target=self.quit, daemon=True).start())
        while not self.stopping.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                break
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()
        self.log("Shutdown")

    def quit(self) -> None:
        with self.lock:
            if self.stopping.is_set():
                return
            self.stopping.set()
            for s in list(self.servers):
                self._stop_server(s)
            self.lock.notify_all()
        with contextlib.suppress(OSError):
            control_path().unlink()
        if self.listener is not None:
            with contextlib.suppress(OSError):
                self.listener.shutdown(socket.SHUT_RDWR)
            self.listener.close()

    # --- connections ---

    def handle(self, conn: socket.socket) -> None:
        with conn:
            line = _read_line(conn)
            if line is None:
                return
            if line == CLIENT_HELLO:
                self.attach(conn)
                return
            status, text = self.command(line)
            with contextlib.suppress(OSError):
                conn.sendall(f"{status}\n{text}".encode())

    def attach(self, conn: socket.socket) -> None:
        pid, uid, _ = peer_credentials(conn)
        self.log(f"New client {pid} (uid {uid}) connected")
        with self.lock:
            server = self._server_for(uid)
            while server is None and not self.stopping.is_set():
                self.lock.wait(1)
                server = self._server_for(uid)
            if server is None:
                return
            server.clients[pid] = conn
            self.client_uids[pid] = uid
        with contextlib.suppress(OSError):
            conn.sendall(f"server {server.pid} uid {server.uid}\n".encode())
        with contextlib.suppress(OSError):  # held until the client goes (EOF) or the server is stopped
            while conn.recv(4096):
                pass
        with self.lock:
            if server.clients.get(pid) is conn:
                del server.clients[pid]
                self.client_uids.pop(pid, None)
                self.log(f"Client {pid} disconnected")
            if server.draining and not server.clients:
                self._stop_server(server)
            self.lock.notify_all()

    def _server_for(self, uid: int) -> Server | None:
        """The server a client of `uid` attaches to now, started if needed; None: it must wait (lock held)."""
        want = 0 if self.multiuser else uid
        for s in self.servers:
            if s.uid == want and not s.draining:
                return s
        for s in [s for s in self.servers if s.uid != want]:
            if not s.draining:  # another uid's server: it shuts down once its clients are done
                s.draining = True
                self.log(f"Server {s.pid} (uid {s.uid}) drains for a client of uid {uid}")
            if not s.clients:
                self._stop_server(s)
        if any(s.uid != want for s in self.servers):
            return None
        return self._start_server(want)

    def _start_server(self, uid: int) -> Server:
        # A forked child, switched to the uid (when the daemon is root), as NVIDIA's daemon starts
        # nvidia-cuda-mps-server; no exec, so no interpreter path has to be readable by that uid.
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child only exists until it is signalled
            try:
                os.closerange(3, 65536)
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                os.setsid()
                if os.geteuid() == 0 and uid != 0:
                    os.setgroups([])
                    os.setgid(uid)
                    os.setuid(uid)
                while True:
                    signal.pause()
            finally:
                os._exit(0)
        server = Server(uid, pid)
        self.servers.append(server)
        self.log(f"Server {server.pid} has started (uid {uid})")
        return server

    def _stop_server(self, server: Server) -> None:
        for conn in server.clients.values():
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        server.clients.clear()
        with contextlib.suppress(OSError):
            os.kill(server.pid, signal.SIGTERM)
            os.waitpid(server.pid, 0)
        if server in self.servers:
            self.servers.remove(server)
        self.log(f"Server {server.pid} exited")
        self.lock.notify_all()

    # --- control commands ---

    def command(self, line: str) -> tuple[str, str]:
        words = line.split()
        if not words:
            return ERR, "empty command\n"
        name, args = words[0], words[1:]
        with self.lock:
            try:
                return OK, self._command(name, args)
            except (ValueError, IndexError) as exc:
                return ERR, f"{line}: {exc or 'bad arguments'}\n"

    def _find(self, pid: str) -> Server:
        for s in self.servers:
            if s.pid == int(pid):
                return s
        raise ValueError(f"no server with pid {pid}")

    def _command(self, name: str, args: list[str]) -> str:
        if name == "get_server_list":
            return "".join(f"{s.pid}\n" for s in self.servers)
        if name == "get_client_list":
            return "".join(f"{pid}\n" for pid in self._find(args[0]).clients)
        if name == "get_server_uid":
            return f"{self._find(args[0]).uid}\n"
        if name == "get_client_uid":
            return f"{self.client_uids[int(args[0])]}\n" if int(args[0]) in self.client_uids else "\n"
        if name == "start_server":
            if args[:1] != ["-uid"] or len(args) != 2:
                raise ValueError("usage: start_server -uid <uid>")
            uid = 0 if self.multiuser else int(args[1])
            if any(s.uid != uid for s in self.servers):
                raise ValueError("a server of another user is running")
            existing = [s for s in self.servers if s.uid == uid]
            return f"{(existing[0] if existing else self._start_server(uid)).pid}\n"
        if name == "shutdown_server":
            server = self._find(args[0])
            if "-f" in args[1:] or not server.clients:
                self._stop_server(server)
            else:
                server.draining = True
            return ""
        if name == "set_default_active_thread_percentage":
            percentage = float(args[0])
            if not 0 < percentage <= 100:
                raise ValueError("must be in (0, 100]")
            self.thread_percentage = f"{percentage:.1f}"
            return f"{self.thread_percentage}\n"
        if name == "get_default_active_thread_percentage":
            return f"{self.thread_percentage}\n"
        if name == "set_default_device_pinned_mem_limit":
            device, value = args[0], args[1]
            if not value[:-1].isdigit() or value[-1] not in "KMG":
                raise ValueError(f"limit {value!r} must be a number with K, M or G")
            self.pinned_limits[device] = value
            return ""
        if name == "get_default_device_pinned_mem_limit":
            return f"{self.pinned_limits.get(args[0], '0')}\n"
        if name == "quit":
            threading.Thread(target=self.quit, daemon=True).start()
            return ""
        raise ValueError("unknown command")


def _read_line(conn: socket.socket) -> str | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            return None if not data else data.decode(errors="replace").strip()
        data += chunk
    return data.decode(errors="replace").strip()


def _connect(timeout: float | None) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(str(control_path()))
    except OSError:
        conn.close()
        return None
    return conn


def control_client() -> int:
    """Each stdin line as one command; prints the answers. 1 if the daemon is unreachable or refused one."""
    rc = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        conn = _connect(10)
        if conn is None:
            where = control_path()
            print(f"Cannot find MPS control daemon process (stand-in; socket {where})", file=sys.stderr)
            return 1
        with conn:
            conn.sendall(line.strip().encode() + b"\n")
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        status, _, text = answer.decode(errors="replace").partition("\n")
        if status == OK:
            sys.stdout.write(text)
        else:
            sys.stderr.write(text or "no answer\n")
            rc = 1
    sys.stdout.flush()
    return rc


def client(hold: bool, timeout: float) -> int:
    """A stand-in CUDA client: attach, print the server, optionally hold the connection."""
    conn = _connect(timeout)
    if conn is None:
        print("no MPS daemon", flush=True)
        return 3
    conn.sendall(f"{CLIENT_HELLO}\n".encode())
    try:
        line = _read_line(conn)
    except TimeoutError:
        print("waiting", flush=True)
        return 4
    if not line:
        print("lost server", flush=True)
        return 1
    print(line, flush=True)
    if not hold:
        conn.close()
        return 0
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # a held context ends with its process
    conn.settimeout(None)
    with contextlib.suppress(OSError):
        while conn.recv(4096):
            pass
    print(f"lost {line.split(' uid ')[0]}", flush=True)
    return 1


def daemonize(multiuser: bool) -> int:
    """-d: start the foreground daemon detached, and return once its control socket answers."""
    argv = [sys.executable, os.path.abspath(__file__), "-f", *(["-M"] if multiuser else [])]
    quiet = subprocess.DEVNULL  # it logs to its log directory; an inherited pipe would never close
    subprocess.Popen(argv, stdin=quiet, stdout=quiet, stderr=quiet, start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        conn = _connect(1)
        if conn is not None:
            conn.close()
            return 0
        time.sleep(0.05)
    print("stand-in MPS control daemon did not start", file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    if argv[:1] == ["client"]:
        p = argparse.ArgumentParser(prog="mps_control.py client")
        p.add_argument("--hold", action="store_true")
        p.add_argument("--timeout", type=float, default=30.0)
        args = p.parse_args(argv[1:])
        return client(args.hold, args.timeout)
    multiuser = any(a in ("-M", "--multiuser-server", "-multiuser-server") for a in argv)
    if "-f" in argv:
        Daemon(multiuser).serve()
        return 0
    if "-d" in argv:
        return daemonize(multiuser)
    if argv:
        print(f"unknown arguments {argv} (usage: see the module docstring)", file=sys.stderr)
        return 2
    return control_client()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
