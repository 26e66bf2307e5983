"""The SSH transport (paramiko), done the way careful operators expect:

- host keys pinned from a known_hosts file: an unknown or changed key is refused with a
  message saying how to pin it; ``host_key_policy: accept-new`` (only when the config
  asks) records a first-seen key in that file and reports it, and still refuses a changed one;
- key-file or ssh-agent authentication, never passwords;
- explicit connect and command timeouts, keepalive, reconnect with backoff;
- SFTP for files; an optional jump host (``jump: user@host:port``).
"""

from __future__ import annotations

import getpass
import os
import socket
import time
from pathlib import Path

import paramiko

from thermab.hosts.transport import CommandError, Result, TransportError

CONNECTION_LOST = (paramiko.SSHException, EOFError, OSError, socket.timeout)


class RefusedError(TransportError):
    """The host answered but must not be used: unknown or changed key, failed login."""


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Like OpenSSH's ``StrictHostKeyChecking=accept-new``: pin a first-seen key."""

    def __init__(self, known_hosts: Path, progress):
        self.known_hosts = known_hosts
        self.progress = progress

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        client.get_host_keys().save(str(self.known_hosts))
        self.progress(f"host {hostname}: new {key.get_name()} key {key.get_fingerprint().hex()} "
                    f"accepted and saved to {self.known_hosts}")


def _parse_target(text: str) -> tuple[str | None, str, int]:
    user, _, rest = text.rpartition("@")
    address, _, port = rest.partition(":")
    return user or None, address, int(port or 22)


class SshTransport:
    def __init__(self, host: str, address: str, *, port: int = 22, user: str | None = None,
                 key_file: str | None = None, known_hosts: str | None = None,
                 host_key_policy: str = "strict", jump: str | None = None,
                 connect_timeout: float = 15, keepalive_s: int = 15, retries: int = 3,
                 progress=print):
        self.host = host
        self.address, self.port = address, port
        self.user = user or getpass.getuser()
        self.key_file = os.path.expanduser(key_file) if key_file else None
        self.known_hosts = Path(os.path.expanduser(known_hosts or "~/.ssh/known_hosts"))
        self.host_key_policy = host_key_policy
        self.jump = jump
        self.connect_timeout = connect_timeout
        self.keepalive_s = keepalive_s
        self.retries = retries
        self.progress = progress
        self._client: paramiko.SSHClient | None = None
        self._jump_client: paramiko.SSHClient | None = None

    @classmethod
    def from_spec(cls, spec) -> "SshTransport":
        s = spec.settings
        return cls(spec.name, s["address"], port=s.get("port", 22), user=s.get("user"),
                   key_file=s.get("key_file"), known_hosts=s.get("known_hosts"),
                   host_key_policy=s.get("host_key_policy", "strict"), jump=s.get("jump"),
                   connect_timeout=s.get("connect_timeout_s", 15))

    # -- connection ----------------------------------------------------------------------

    def _new_client(self) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if self.known_hosts.exists():
            client.load_host_keys(str(self.known_hosts))
        if self.host_key_policy == "accept-new":
            client.set_missing_host_key_policy(_AcceptNewPolicy(self.known_hosts, self.progress))
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        return client

    def _connect_once(self) -> paramiko.SSHClient:
        sock = None
        if self.jump:
            jump_user, jump_address, jump_port = _parse_target(self.jump)
            self._jump_client = self._new_client()
            self._open(self._jump_client, jump_address, jump_port, jump_user or self.user, None)
            sock = self._jump_client.get_transport().open_channel(
                "direct-tcpip", (self.address, self.port), ("127.0.0.1", 0), timeout=self.connect_timeout)
        client = self._new_client()
        self._open(client, self.address, self.port, self.user, sock)
        client.get_transport().set_keepalive(self.keepalive_s)
        return client

    def _open(self, client, address, port, user, sock) -> None:
        where = f"{user}@{address}:{port}"
        try:
            client.connect(address, port=port, username=user, key_filename=self.key_file, sock=sock,
                           timeout=self.connect_timeout, banner_timeout=self.connect_timeout,
                           auth_timeout=self.connect_timeout, allow_agent=True, look_for_keys=self.key_file is None)
        except paramiko.BadHostKeyException as error:
            raise RefusedError(self.host, f"host key of {where} CHANGED ({error.key.get_name()} "
                                 f"{error.key.get_fingerprint().hex()}, pinned "
                                 f"{error.expected_key.get_fingerprint().hex()} in {self.known_hosts}); "
                                 "refusing to connect") from None
        except paramiko.AuthenticationException as error:
            raise RefusedError(self.host, f"authentication to {where} failed ({error}); "
                                 "check 'key_file' or the ssh-agent") from None
        except paramiko.SSHException as error:
            if "not found in known_hosts" in str(error):
                raise RefusedError(self.host, f"host key of {where} is not pinned in {self.known_hosts}; "
                                     f"add it (ssh-keyscan -p {port} {address} >> {self.known_hosts}) or set "
                                     "host_key_policy: accept-new for this host") from None
            raise TransportError(self.host, f"cannot connect to {where}: {error}") from None
        except (OSError, socket.timeout) as error:
            raise TransportError(self.host, f"cannot reach {where}: {error}") from None

    def client(self) -> paramiko.SSHClient:
        """The live connection, reconnecting with backoff if it dropped.

        Only connecting is retried: a command whose connection broke is reported, never
        re-sent, since running a lifecycle command twice is not harmless."""
        transport = self._client.get_transport() if self._client else None
        if transport is not None and transport.is_active():
            return self._client
        self.close()
        delay = 1.0
        for attempt in range(1, self.retries + 1):
            try:
                self._client = self._connect_once()
                return self._client
            except RefusedError:
                raise
            except TransportError as error:
                if attempt == self.retries:
                    raise
                self.progress(f"{error}; retrying in {delay:.0f} s ({attempt}/{self.retries})")
                self.close()
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _use(self, what: str, action):
        try:
            return action(self.client())
        except TransportError:
            raise
        except CONNECTION_LOST as error:
            self.close()
            raise TransportError(self.host, f"connection lost during {what}: {error}") from None

    # -- the Transport protocol ------------------------------------------------------------

    def _start(self, command: str) -> paramiko.Channel:
        """Open a channel and send the command. A connection found dead here is
        reconnected once: the command has not started, so sending it again is safe."""
        for attempt in (1, 2):
            try:
                channel = self.client().get_transport().open_session(timeout=self.connect_timeout)
                channel.exec_command(command)
                return channel
            except CONNECTION_LOST as error:
                self.close()
                if attempt == 2:
                    raise TransportError(self.host, f"cannot start {command!r}: {error}") from None
                self.progress(f"host {self.host}: connection lost ({error or type(error).__name__}); reconnecting")
        raise AssertionError("unreachable")

    def run(self, command: str, *, timeout: float = 60, check: bool = True) -> Result:
        channel = self._start(command)
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        try:
            # drain both streams as they come, so a chatty command never blocks on a full window
            while True:
                if channel.recv_ready():
                    out += channel.recv(65536)
                elif channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
                elif channel.exit_status_ready():
                    break
                elif time.monotonic() > deadline:
                    raise TransportError(self.host, f"command timed out after {timeout:.0f} s: {command}")
                else:
                    time.sleep(0.01)
            exited = channel.recv_exit_status()
        except CONNECTION_LOST as error:
            self.close()
            raise TransportError(self.host, f"connection lost during {command!r}: {error}") from None
        finally:
            channel.close()
        result = Result(command, exited, out.decode(errors="replace"), err.decode(errors="replace"))
        if check and not result.ok:
            raise CommandError(self.host, result)
        return result

    def put(self, local: Path, remote: str) -> None:
        def upload(client):
            with client.open_sftp() as sftp:
                sftp.put(str(local), remote)

        self._use(f"upload of {remote}", upload)

    def get(self, remote: str, local: Path) -> None:
        def download(client):
            with client.open_sftp() as sftp:
                try:
                    sftp.get(remote, str(local))
                except FileNotFoundError:
                    raise TransportError(self.host, f"cannot read {remote}: no such file") from None

        self._use(f"download of {remote}", download)

    def close(self) -> None:
        for client in (self._client, self._jump_client):
            if client is not None:
                client.close()
        self._client = self._jump_client = None
