#!/usr/bin/env python3
"""A stand-in for NVIDIA's MPS control daemon (nvidia-cuda-mps-control) on machines without a GPU.

It is a STAND-IN: no GPU, no CUDA, no NVIDIA binary. It speaks enough of the control interface for gpupack's
agent and models what the node side depends on. Python standard library only, one file, so the image build
can add it for tests (`deploy/image/build.sh --standins` installs it as
/opt/gpupack-standin/nvidia-cuda-mps-control) and tests can run it from the checkout.

Modes (the first three are nvidia-cuda-mps-control's own):
  mps_control.py -d [-M]      start the control daemon in the background and return once it answers
  mps_control.py -f [-M]      run the control daemon in the foreground (what a daemon pod runs)
  mps_control.py              control client: one command per stdin line, each answer on stdout (a
                              daemon-side error on stderr); exit 0 whenever the daemon answered, refusals
                              included (as measured); exit 1 only if no daemon can be reached
  mps_control.py client [--hold] [--work S] [--memory] [--timeout S]
                              a stand-in CUDA client: attaches to a server (the daemon picks or starts one
                              for the caller's uid) and prints `server <pid> uid <uid> pinned <defaults>
                              threads <pct>`; --memory then prints `usable <MiB>` (what it could allocate);
                              --hold keeps the connection (an idle CUDA context) until SIGTERM (exit 0) or
                              until the daemon or its server goes away (prints `lost server <pid> ...`,
                              exit 1); --work S keeps work in flight for S seconds, then prints `done`
                              (exit 0), or `error <CUDA error>` (exit 1) when its server faults, ends it or
                              goes. No answer within --timeout S (default 30): prints `waiting`, exit 4.
                              No daemon: prints `direct context: no MPS, whole GPU, no limits` and runs
                              (exit 0), as a real client does.
  `-M` (also `--multiuser-server`): one server, run as root, serves clients of every uid at once.
  `-p 3` (or CUDA_MPS_PROTOCOL_VERSION=3, which wins): MPS v3 (driver r615) named servers and namespaces;
  `-m`/`--multiuser` is v3's spelling of multi-user.
  mps_control.py server|namespace ...  a v3 control command given as arguments (below), as r615's CLI takes
                              them; exit 1 if the daemon refused it or cannot be reached

Environment: CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps; the control socket is `<dir>/control`),
CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps; the daemon appends to `control.log` there).

Control commands answered (names and arguments as nvidia-cuda-mps-control documents them):
  get_server_list                         server pids, one a line
  get_client_list <server pid>            that server's client pids, one a line
  terminate_client <server pid> <client pid>   end that client (it sees cudaErrorMpsClientTerminated)
  start_server -uid <uid>                 start a server for uid (refused while another uid's server runs)
  shutdown_server <pid> [-f]              stop a server once its clients are gone (-f: now, dropping them)
  set_default_active_thread_percentage <1..100> / get_default_active_thread_percentage
  set_default_device_pinned_mem_limit <ordinal|uuid> <N[K|M|G]> / get_default_device_pinned_mem_limit <dev>
  quit [-t <seconds>]                     stop every server and the daemon
Stand-in only (no NVIDIA equivalent; for tests): `get_client_uid <client pid>`, `get_server_uid <pid>`.

MPS v3 commands (spellings from NVIDIA's mpsv3-interface page as docs/node-side.md quotes them; the answers'
text is the stand-in's own, UNVERIFIED against r615):
  server create <name> [--uid=<uid>] [--allowed-devices=<list>]   (multi-user: only --uid=0)
  server set <name> [--pinned-memory-limit=<N[K|M|G]>] [--active-thread-percentage=<1..100>]  (default ns)
  server delete <name> [--force]   server list   server get <name> pipe-directory
  namespace create <ns> --server=<s>
  namespace set <ns> --server=<s> [--pinned-memory-limit=<N[K|M|G]>] [--active-thread-percentage=<1..100>]
                [--client-priority=0|1]
  namespace delete <ns> --server=<s> [--force]   (refused while clients are attached, unless --force)
  namespace get <ns> <server> <field>  (pinned-memory-limit, active-thread-percentage, client-priority)
  namespace list [--format=csv,noheader]  (server,namespace,pinned-memory-limit,active-thread-percentage)
Names: lowercase letters, digits and `_`, at most 64 characters. A named namespace inherits nothing from its
server: without its own limits it reports the whole GPU ("unlimited", 100). Each namespace is reached at
`<pipe>/<server>/<namespace>/control` (the default one also at `<pipe>/<server>/control`): a client attached
there belongs to that namespace and is told its limits.

What it models, each point following a row of the measured table (docs/node-side.md, "MPS as measured": H100,
driver 580); tests/contract/mps_contract.py asserts the same of this stand-in and of the real binary:
- "The control socket": `<pipe>/control` and `<pipe>/control_privileged` are SOCK_SEQPACKET sockets (a stream
  connect fails with EPROTOTYPE); `control` is srw-rw-rw-, `control_privileged` srwxr-xr-x for root. The
  control client uses `control_privileged` where it can connect (root on the host's pipe dir), else `control`.
  Through `control` only reading commands are served: a setting, `quit`, starting/stopping servers or ending
  clients are refused with the real daemon's words ("Insufficient privileges for UID N. ...", "Not enough
  privilege to execute quit command") and the control client exits 0, as the real one does. Every other answer
  of the daemon (errors too) also exits 0; only a daemon that cannot be reached exits 1 (the real binary's
  status for non-privilege errors is unmeasured: nothing in gpupack may trust it).
- "Lifetimes": SIGKILL or SIGTERM of the daemon takes its servers down (each server exits once its daemon is
  gone) and every client sees CUDA_ERROR_MPS_RPC_FAILURE. A client with no daemon to reach runs without MPS:
  a direct context on the whole GPU, no limits, no error. A client killed while its work is in flight
  (`client --work`) makes every other client of its server fail with cudaErrorIllegalAddress, unless it was
  ended first with `terminate_client <server> <client>` (it fails with cudaErrorMpsClientTerminated, the
  others finish); a client that ends its work and exits harms nobody; the server is not wedged after either.
- "Limits": a client's pinned limit is the smaller of its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and the daemon's
  default for the device, and the CUDA context's 514 MiB counts against it (3000M gave 2 486 MiB of
  allocations, 2000M gave 1 486 MiB): `client --memory` prints what the client could allocate.
- A client is identified by the pid in its socket's peer credentials (SO_PEERCRED), as memory accounting
  does: seen from a daemon outside the client's pid namespace without hostPID, that pid is 0.
- One server per uid without -M (a real forked process, run as that uid when the daemon is root): a client of
  another uid waits until every client of the running server has gone, then the daemon replaces the server
  (NVIDIA's "serialized exclusive access of the GPU between users"). With -M one root server serves all.
- A client's connection is long-lived; it ends when the client exits, its server is shut down or the
  daemon quits. The daemon's lifetime is its own: nothing here ends when a control client disconnects.
What it does not model: GPUs, device ordinals beyond storing the defaults, memory or thread limits being
enforced (it only tells a client its namespace's limits), memacct, sm partitions, the config file (`-a`),
the control protocol's wire format (the control client here is this same program).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
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
PRIVILEGED = "control_privileged"
# Measured (mps-measured.md, "The control socket"): what the daemon says when a command needs privilege.
QUIT_REFUSED = "Not enough privilege to execute quit command"
SETTING_REFUSED = (
    "Insufficient privileges for UID {uid}. Control deamon settings can only be modified by the user who "
    "started it or by the root user."
)
# Commands served through the unprivileged `control` socket (reading only); measured for get_server_list.
UNPRIVILEGED = (
    "get_server_list",
    "get_client_list",
    "get_default_active_thread_percentage",
    "get_default_device_pinned_mem_limit",
    "get_server_uid",
    "get_client_uid",
)
CONTEXT_RESERVE_MIB = 514  # measured: the CUDA context's share of a pinned limit (driver API client)
RPC_FAILURE = "CUDA_ERROR_MPS_RPC_FAILURE"
ILLEGAL_ADDRESS = "cudaErrorIllegalAddress"
TERMINATED = "cudaErrorMpsClientTerminated"
MSG = 65536  # one SEQPACKET message at most
PROTOCOL_ENV = "CUDA_MPS_PROTOCOL_VERSION"
V3_NAME = re.compile(r"[a-z0-9_]{1,64}")
V3_FIELDS = ("pinned-memory-limit", "active-thread-percentage", "client-priority")
UNLIMITED = "unlimited"


def pipe_dir() -> Path:
    return Path(os.environ.get(PIPE_ENV) or DEFAULT_PIPE)


def control_path() -> Path:
    return pipe_dir() / "control"


def seqpacket() -> socket.socket:
    return socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def _recv(conn: socket.socket) -> str | None:
    """One message; None at the end of the connection."""
    data = conn.recv(MSG)
    return data.decode(errors="replace").strip() if data else None


def _send(conn: socket.socket, text: str) -> None:
    with contextlib.suppress(OSError):
        conn.send(text.encode())


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
    name: str = ""  # v3: the named server ("" for a legacy per-uid server)
    # v3: namespace -> its limits (field -> value); "default" is the built-in one the server-level values set
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    listeners: dict[str, socket.socket] = field(default_factory=dict)  # namespace -> its control socket
    client_ns: dict[int, str] = field(default_factory=dict)  # client pid -> its namespace
    busy: set[int] = field(default_factory=set)  # clients with work in flight
    ended: set[int] = field(default_factory=set)  # clients ended through terminate_client


class Daemon:
    """The control daemon: accepts control commands and client attachments on `<pipe>/control`."""

    def __init__(self, multiuser: bool, protocol: int = 2) -> None:
        self.multiuser = multiuser
        self.protocol = protocol
        self.lock = threading.Condition()
        self.servers: list[Server] = []
        self.client_uids: dict[int, int] = {}
        self.thread_percentage = "100.0"
        self.pinned_limits: dict[str, str] = {}
        self.stopping = threading.Event()
        self.log_path = Path(os.environ.get(LOG_ENV) or DEFAULT_LOG) / "control.log"
        self.listener: socket.socket | None = None
        self.privileged = seqpacket()

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
        listener = self._listen(path, 0o666)  # clients of every uid must reach it
        self.privileged = self._listen(pipe_dir() / PRIVILEGED, 0o755)  # root only
        threading.Thread(target=self._accept_privileged, daemon=True).start()
        (pipe_dir() / "nvidia-cuda-mps-control.pid").write_text(f"{os.getpid()}\n")
        self.listener = listener
        self.log(
            f"Startup (stand-in, protocol {self.protocol}, multiuser={self.multiuser}, pid {os.getpid()})"
        )
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: threading.Thread(target=self.quit, daemon=True).start())
        while not self.stopping.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                break
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()
        self.log("Shutdown")

    @staticmethod
    def _listen(path: Path, mode: int) -> socket.socket:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a socket file left by a daemon that died
        listener = seqpacket()
        listener.bind(str(path))
        os.chmod(path, mode)
        listener.listen(64)
        return listener

    def _accept_privileged(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.privileged.accept()
            except OSError:
                return
            threading.Thread(target=self.handle, args=(conn, None, True), daemon=True).start()

    def quit(self) -> None:
        with self.lock:
            if self.stopping.is_set():
                return
            self.stopping.set()
            for s in list(self.servers):
                self._stop_server(s)
            self.lock.notify_all()
        for name in ("control", PRIVILEGED):
            with contextlib.suppress(OSError):
                (pipe_dir() / name).unlink()
        with contextlib.suppress(OSError):
            self.privileged.close()
        if self.listener is not None:
            with contextlib.suppress(OSError):
                self.listener.shutdown(socket.SHUT_RDWR)
            self.listener.close()

    # --- connections ---

    def handle(
        self, conn: socket.socket, route: tuple[Server, str] | None = None, privileged: bool = False
    ) -> None:
        with conn:
            line = _recv(conn)
            if line is None:
                return
            if line == CLIENT_HELLO:
                if route is not None:
                    self.attach_v3(conn, *route)
                else:
                    self.attach(conn)
                return
            words = line.split()
            if not privileged and words and words[0] not in UNPRIVILEGED:
                uid = peer_credentials(conn)[1]
                said = QUIT_REFUSED if words[0] == "quit" else SETTING_REFUSED.format(uid=uid)
                self.log(f"Refused through the unprivileged socket (uid {uid}): {line}")
                _send(conn, f"{OK}\n{said}\n")  # measured: the control client exits 0 on a refusal
                return
            status, text = self.command(line)
            _send(conn, f"{status}\n{text}")

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
        pinned = " ".join(f"{d}={v}" for d, v in sorted(self.pinned_limits.items())) or UNLIMITED
        threads = self.thread_percentage
        _send(conn, f"server {server.pid} uid {server.uid} pinned {pinned} threads {threads}\n")
        self._follow(conn, server, pid)
        with self.lock:
            if server.draining and not server.clients:
                self._stop_server(server)
            self.lock.notify_all()

    def _follow(self, conn: socket.socket, server: Server, pid: int) -> None:
        """The client's messages until it goes: `busy` (work in flight), `idle` (its work synchronized),
        `bye` (a normal exit). Gone while busy, and not ended through terminate_client first, it breaks
        every other client of its server (measured: 4 of 4 tries)."""
        clean = False
        with contextlib.suppress(OSError):  # held until the client goes (EOF) or the server is stopped
            while (message := _recv(conn)) is not None:
                with self.lock:
                    if message == "busy":
                        server.busy.add(pid)
                    elif message == "idle":
                        server.busy.discard(pid)
                    elif message == "bye":
                        clean = True
        with self.lock:
            killed_busy = pid in server.busy and pid not in server.ended and not clean
            server.busy.discard(pid)
            server.ended.discard(pid)
            if server.clients.get(pid) is conn:
                del server.clients[pid]
                server.client_ns.pop(pid, None)
                self.client_uids.pop(pid, None)
                self.log(f"Client {pid} disconnected")
            if killed_busy and server in self.servers:
                self.log(f"Client {pid} died with work in flight: the server's other clients fault")
                for other, c in list(server.clients.items()):
                    _send(c, f"fault {ILLEGAL_ADDRESS}\n")
                    with contextlib.suppress(OSError):
                        c.shutdown(socket.SHUT_RDWR)
                    server.clients.pop(other, None)
                    server.client_ns.pop(other, None)
                    server.busy.discard(other)

    def attach_v3(self, conn: socket.socket, server: Server, ns: str) -> None:
        """A client that came through `<pipe>/<server>/<ns>/control`: a client of that namespace."""
        pid, uid, _ = peer_credentials(conn)
        with self.lock:
            if server not in self.servers or ns not in server.namespaces:
                return
            if not self.multiuser and uid != server.uid:
                self.log(f"Client {pid} (uid {uid}) refused by server {server.name} (uid {server.uid})")
                _send(conn, "refused CUDA_ERROR_NOT_PERMITTED\n")
                return
            limits = server.namespaces[ns]
            server.clients[pid], server.client_ns[pid] = conn, ns
            self.client_uids[pid] = uid
        self.log(f"New client {pid} (uid {uid}) in namespace {server.name}/{ns}")
        pinned = limits.get("pinned-memory-limit", UNLIMITED)
        threads = limits.get("active-thread-percentage", "100")
        _send(
            conn,
            f"server {server.pid} uid {server.uid} namespace {server.name}/{ns} "
            f"pinned {pinned} threads {threads}\n",
        )
        self._follow(conn, server, pid)

    def _server_for(self, uid: int) -> Server | None:
        """The server a client of `uid` attaches to now, started if needed; None: it must wait (lock held)."""
        want = 0 if self.multiuser else uid
        legacy = [s for s in self.servers if not s.name]  # v3 named servers are reached by their own sockets
        for s in legacy:
            if s.uid == want and not s.draining:
                return s
        for s in [s for s in legacy if s.uid != want]:
            if not s.draining:  # another uid's server: it shuts down once its clients are done
                s.draining = True
                self.log(f"Server {s.pid} (uid {s.uid}) drains for a client of uid {uid}")
            if not s.clients:
                self._stop_server(s)
        if any(s.uid != want for s in legacy):
            return None
        return self._start_server(want)

    def _start_server(self, uid: int) -> Server:
        # A forked child, switched to the uid (when the daemon is root), as NVIDIA's daemon starts
        # nvidia-cuda-mps-server; no exec, so no interpreter path has to be readable by that uid.
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child only exists until it is signalled
            try:
                parent = os.getppid()
                os.closerange(3, 65536)
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                os.setsid()
                if os.geteuid() == 0 and uid != 0:
                    os.setgroups([])
                    os.setgid(uid)
                    os.setuid(uid)
                while os.getppid() == parent:  # measured: a server exits once its daemon is gone
                    time.sleep(0.2)
            finally:
                os._exit(0)
        server = Server(uid, pid)
        self.servers.append(server)
        self.log(f"Server {server.pid} has started (uid {uid})")
        return server

    def _stop_server(self, server: Server) -> None:
        for ns in list(server.listeners):
            self._close_namespace(server, ns)
        if server.name:
            shutil.rmtree(pipe_dir() / server.name, ignore_errors=True)
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
            except OSError as exc:  # e.g. a socket path past the 107-byte limit
                return ERR, f"{line}: {exc}\n"

    def _find(self, pid: str) -> Server:
        for s in self.servers:
            if s.pid == int(pid):
                return s
        raise ValueError(f"no server with pid {pid}")

    def _command(self, name: str, args: list[str]) -> str:
        if name in ("server", "namespace"):
            if self.protocol != 3:
                raise ValueError(f"`{name}` commands need MPS v3 (start the daemon with -p 3)")
            return self._v3(name, args)
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
        if name == "terminate_client":
            server, pid = self._find(args[0]), int(args[1])
            conn = server.clients.get(pid)
            if conn is None:
                raise ValueError(f"no client {pid} of server {server.pid}")
            server.ended.add(pid)
            _send(conn, f"terminated {TERMINATED}\n")
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            return ""
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

    # --- MPS v3: named servers and namespaces (lock held) ---

    def _named(self, name: str) -> Server:
        for s in self.servers:
            if s.name == name:
                return s
        raise ValueError(f"no server named {name!r}")

    def _open_namespace(self, server: Server, ns: str) -> None:
        """Listen at <pipe>/<server>/<ns>/control (the default namespace: also at <pipe>/<server>/control)."""
        paths = [pipe_dir() / server.name / ns / "control"]
        if ns == "default":
            paths.append(pipe_dir() / server.name / "control")
        for i, path in enumerate(paths):
            path.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(path.parent, 0o755)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            listener = seqpacket()
            listener.bind(str(path))
            os.chmod(path, 0o777)
            listener.listen(64)
            server.listeners[ns if i == 0 else f"{ns}/"] = listener
            threading.Thread(target=self._accept, args=(listener, server, ns), daemon=True).start()

    def _accept(self, listener: socket.socket, server: Server, ns: str) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self.handle, args=(conn, (server, ns)), daemon=True).start()

    def _close_namespace(self, server: Server, ns: str) -> None:
        for key in (ns, f"{ns}/"):
            listener = server.listeners.pop(key, None)
            if listener is not None:
                with contextlib.suppress(OSError):
                    listener.shutdown(socket.SHUT_RDWR)
                listener.close()
        if ns != "default" and server.name:
            shutil.rmtree(pipe_dir() / server.name / ns, ignore_errors=True)

    def _v3(self, name: str, args: list[str]) -> str:
        opts = {a[2:].partition("=")[0]: a.partition("=")[2] for a in args if a.startswith("--")}
        words = [a for a in args if not a.startswith("--")]
        if not words:
            raise ValueError(f"usage: {name} <verb> ...")
        verb, rest = words[0], words[1:]
        for key, value in opts.items():
            if key in ("pinned-memory-limit",) and not re.fullmatch(r"[0-9]+[KMG]?", value):
                raise ValueError(f"--{key}={value}: must be a number with K, M or G")
            if key == "active-thread-percentage" and not (value.isdigit() and 1 <= int(value) <= 100):
                raise ValueError(f"--{key}={value}: must be in 1..100")
            if key == "client-priority" and value not in ("0", "1"):
                raise ValueError(f"--{key}={value}: must be 0 or 1")
        for word in rest[:1]:
            if verb != "list" and not V3_NAME.fullmatch(word):
                raise ValueError(f"name {word!r}: lowercase letters, digits and _ only, at most 64")
        if name == "server":
            return self._v3_server(verb, rest, opts)
        return self._v3_namespace(verb, rest, opts)

    def _v3_server(self, verb: str, rest: list[str], opts: dict[str, str]) -> str:
        if verb == "list":
            return "".join(f"{s.name}\n" for s in self.servers if s.name)
        target = rest[0]
        if verb == "create":
            if any(s.name == target for s in self.servers):
                raise ValueError(f"server {target!r} exists")
            uid = int(opts.get("uid", "0"))
            if self.multiuser and uid != 0:
                raise ValueError("in multi-user mode a server runs as --uid=0 only")
            server = self._start_server(uid)
            server.name, server.namespaces = target, {"default": {}}
            self._open_namespace(server, "default")
            return f"{server.pid}\n"
        server = self._named(target)
        if verb == "set":
            server.namespaces["default"].update({k: v for k, v in opts.items() if k in V3_FIELDS})
            return ""
        if verb == "get":
            if rest[1:] != ["pipe-directory"]:
                raise ValueError("usage: server get <name> pipe-directory")
            return f"{pipe_dir() / server.name}\n"
        if verb == "delete":
            if server.clients and "force" not in opts:
                raise ValueError(f"server {target!r} has clients; --force drops them")
            self._stop_server(server)
            return ""
        raise ValueError(f"unknown server command {verb!r}")

    def _v3_namespace(self, verb: str, rest: list[str], opts: dict[str, str]) -> str:
        if verb == "list":
            rows = [
                f"{s.name},{ns},{lim.get('pinned-memory-limit', UNLIMITED)},"
                f"{lim.get('active-thread-percentage', '100')}\n"
                for s in self.servers
                if s.name
                for ns, lim in s.namespaces.items()
            ]
            head = "" if "noheader" in opts.get("format", "") else "server,namespace,pinned,threads\n"
            return head + "".join(rows)
        if verb == "get":
            if len(rest) != 3 or rest[2] not in V3_FIELDS:
                raise ValueError(f"usage: namespace get <ns> <server> <{'|'.join(V3_FIELDS)}>")
            limits = self._named(rest[1]).namespaces.get(rest[0])
            if limits is None:
                raise ValueError(f"no namespace {rest[0]!r} in server {rest[1]!r}")
            return f"{limits.get(rest[2], UNLIMITED if rest[2] == 'pinned-memory-limit' else '')}\n"
        if "server" not in opts:
            raise ValueError(f"namespace {verb} needs --server=<name>")
        server, ns = self._named(opts["server"]), rest[0]
        if verb == "create":
            if ns in server.namespaces:
                raise ValueError(f"namespace {ns!r} exists in server {server.name!r}")
            server.namespaces[ns] = {}  # a named namespace inherits nothing from its server
            self._open_namespace(server, ns)
            return ""
        if ns not in server.namespaces:
            raise ValueError(f"no namespace {ns!r} in server {server.name!r}")
        if verb == "set":
            server.namespaces[ns].update({k: v for k, v in opts.items() if k in V3_FIELDS})
            return ""
        if verb == "delete":
            if ns == "default":
                raise ValueError("the default namespace cannot be deleted")
            attached = [pid for pid, n in server.client_ns.items() if n == ns]
            if attached and "force" not in opts:
                raise ValueError(f"namespace {ns!r} has clients {attached}; --force drops them")
            for pid in attached:
                with contextlib.suppress(OSError):
                    server.clients[pid].shutdown(socket.SHUT_RDWR)
            self._close_namespace(server, ns)
            del server.namespaces[ns]
            return ""
        raise ValueError(f"unknown namespace command {verb!r}")


def _connect(timeout: float | None, path: Path | None = None) -> socket.socket | None:
    conn = seqpacket()
    conn.settimeout(timeout)
    try:
        conn.connect(str(path or control_path()))
    except OSError:
        conn.close()
        return None
    return conn


def _control_connection() -> socket.socket | None:
    """`control_privileged` where this caller may connect (root on the daemon's own pipe dir), else
    `control` (a pod's directory holds only that link)."""
    return _connect(10, pipe_dir() / PRIVILEGED) or _connect(10)


def control_client(lines: list[str] | None = None) -> int:
    """Each stdin line (or each of `lines`) as one command; prints the answers. Exit 1 only when the daemon
    cannot be reached: an answer, a refusal or an error, is exit 0 (measured for refusals)."""
    for line in sys.stdin if lines is None else lines:
        if not line.strip():
            continue
        conn = _control_connection()
        if conn is None:
            where = control_path()
            print(f"Cannot find MPS control daemon process (stand-in; socket {where})", file=sys.stderr)
            return 1
        with conn:
            conn.send(line.strip().encode() + b"\n")
            answer = _recv(conn) or ""
        status, _, text = answer.partition("\n")
        text = text + "\n" if text else ""
        (sys.stdout if status == OK else sys.stderr).write(text or ("" if status == OK else "no answer\n"))
    sys.stdout.flush()
    return 0


def pinned_mib(value: str) -> int | None:
    """`2048M`, `2G`, `512K`, `2048` (MiB) as MiB; None for `unlimited` or nonsense."""
    value = value.strip()
    units = {"K": 1 / 1024, "M": 1, "G": 1024}
    if value[-1:].upper() in units and value[:-1].isdigit():
        return int(int(value[:-1]) * units[value[-1].upper()])
    return int(value) if value.isdigit() else None


def usable_mib(attach_line: str, env_limit: str, device: str) -> int | None:
    """What this client could allocate on `device` ("0" or a UUID): the smaller of its env's pinned limit
    and the daemon's default, less the context (None: no limit applies)."""
    words = attach_line.split()
    daemon = words[words.index("pinned") + 1] if "pinned" in words else UNLIMITED
    caps = []
    for part in [*env_limit.split(","), *daemon.split()]:
        key, _, value = part.partition("=")
        if key in (device, "0") and (mib := pinned_mib(value)) is not None:
            caps.append(mib)
    return min(caps) - CONTEXT_RESERVE_MIB if caps else None


def client(hold: bool, timeout: float, work_s: float = 0.0, memory: bool = False) -> int:
    """A stand-in CUDA client: attach, print the server, optionally hold the connection or do work."""
    conn = _connect(timeout)
    if conn is None:
        # Measured: with no daemon behind the pipe dir CUDA makes a direct context on the whole GPU.
        print("direct context: no MPS, whole GPU, no limits", flush=True)
        if memory:
            print("usable unlimited", flush=True)
        if work_s:
            time.sleep(work_s)
            print("done", flush=True)
        elif hold:
            signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
            signal.pause()
        return 0
    conn.send(f"{CLIENT_HELLO}\n".encode())
    try:
        line = _recv(conn)
    except TimeoutError:
        print("waiting", flush=True)
        return 4
    if not line:
        print(f"lost server {RPC_FAILURE}", flush=True)
        return 1
    if work_s:  # in flight before anyone is told it is served
        with contextlib.suppress(OSError):
            conn.send(b"busy\n")
    print(line, flush=True)
    if memory:
        device = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
        got = usable_mib(line, os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", ""), device)
        print(f"usable {'unlimited' if got is None else got}", flush=True)
    conn.settimeout(None)
    if work_s:
        return _work(conn, line, work_s)
    if not hold:
        conn.send(b"bye\n")
        conn.close()
        return 0
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # a held context ends with its process
    with contextlib.suppress(OSError):
        while (message := _recv(conn)) is not None:
            if message.split()[0] in ("fault", "terminated"):
                print(f"error {message.split()[-1]}", flush=True)
                return 1
    print(f"lost {line.split(' uid ')[0]} {RPC_FAILURE}", flush=True)
    return 1


def _work(conn: socket.socket, line: str, seconds: float) -> int:
    """Kernels in flight for `seconds`, then synchronize and exit normally. A signal meanwhile kills the
    process with its work in flight (SIGTERM's default action, as for a CUDA program that does not catch
    it); the daemon then sees a busy client vanish."""
    said: list[str] = []

    def listen() -> None:
        with contextlib.suppress(OSError):
            message = _recv(conn)
            said.append(message.split()[-1] if message else RPC_FAILURE)

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    t.join(seconds)
    if said:
        print(f"error {said[0]}", flush=True)
        return 1
    try:
        conn.send(b"idle\n")
        conn.send(b"bye\n")
    except OSError:  # the server went at the very end: the work's result is lost with it
        print(f"error {RPC_FAILURE}", flush=True)
        return 1
    print("done", flush=True)
    return 0


def daemonize(multiuser: bool, protocol: int) -> int:
    """-d: start the foreground daemon detached, and return once its control socket answers."""
    argv = [sys.executable, os.path.abspath(__file__), "-f", *(["-M"] if multiuser else [])]
    argv += ["-p", str(protocol)]
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


def protocol_of(argv: list[str]) -> int:
    """-p N / --protocol=N, overridden by CUDA_MPS_PROTOCOL_VERSION (NVIDIA: the env var wins)."""
    value = "2"
    for i, a in enumerate(argv):
        if a in ("-p", "--protocol") and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith("--protocol="):
            value = a.partition("=")[2]
    value = os.environ.get(PROTOCOL_ENV) or value
    return 3 if value == "3" else 2


def main(argv: list[str]) -> int:
    if argv[:1] in (["server"], ["namespace"]):
        return control_client([" ".join(argv)])
    if argv[:1] == ["client"]:
        p = argparse.ArgumentParser(prog="mps_control.py client")
        p.add_argument("--hold", action="store_true")
        p.add_argument("--timeout", type=float, default=30.0)
        p.add_argument("--work", type=float, default=0.0, help="seconds of work in flight, then exit 0")
        p.add_argument("--memory", action="store_true", help="print what the client could allocate")
        args = p.parse_args(argv[1:])
        return client(args.hold, args.timeout, args.work, args.memory)
    multiuser = any(a in ("-M", "--multiuser-server", "-multiuser-server", "-m", "--multiuser") for a in argv)
    protocol = protocol_of(argv)
    if "-f" in argv:
        Daemon(multiuser, protocol).serve()
        return 0
    if "-d" in argv:
        return daemonize(multiuser, protocol)
    if argv:
        print(f"unknown arguments {argv} (usage: see the module docstring)", file=sys.stderr)
        return 2
    return control_client()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
