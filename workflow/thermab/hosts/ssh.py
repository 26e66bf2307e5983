"""The SSH transport (paramiko), done the way careful operators expect:

- host keys checked as OpenSSH checks them (``known_hosts.py``): every line of the user's
  known_hosts honoured and none rewritten; ``@revoked`` keys refused; host certificates
  trusted through ``@cert-authority`` lines; an unknown or changed key refused with a
  message saying how to pin it.  ``host_key_policy: accept-new`` (only when the config
  asks) appends a first-seen key as one line to thermab's own file (or to the
  ``known_hosts`` file the config names), and still refuses a changed one;
- key-file or ssh-agent authentication, never passwords;
- explicit connect and command timeouts, keepalive, reconnect with backoff; a failure
  says what happened: refused, timed out, no route, authentication failed;
- SFTP for files; an optional jump host (``jump: user@host:port``).
"""

from __future__ import annotations

import errno
import getpass
import logging
import os
import socket
import time
from pathlib import Path

import paramiko

from thermab.config import check_file
from thermab.errors import UserError
from thermab.hosts import known_hosts
from thermab.hosts.transport import CommandError, LineReader, Result, TransportError

CONNECTION_LOST = (paramiko.SSHException, EOFError, OSError, socket.timeout)
MAX_KEY_BYTES = 2**20
# paramiko's transport thread logs each failure with its traceback; thermab reports every
# one itself, in one line, so those records go nowhere (not to Python's last-resort stderr)
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False
USER_KNOWN_HOSTS = "~/.ssh/known_hosts"
# thermab's own pins (accept-new), beside the simulated nodes under the workflow directory
OWN_KNOWN_HOSTS = ".thermab/known_hosts"


class RefusedError(TransportError):
    """The host answered but must not be used: unknown, changed or revoked key, failed login."""


def describe_socket_error(error: OSError, timeout: float) -> str:
    """What a failed TCP connect means, in the words a user can act on."""
    if isinstance(error, socket.timeout):
        return f"timed out after {timeout:g} s (the host is down, or a firewall drops the packets)"
    if isinstance(error, socket.gaierror):
        return f"cannot resolve the address ({error.strerror})"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused (nothing listens on that port, or a firewall rejects it)"
    if error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "no route to host (wrong address, or the host or its network is down)"
    return error.strerror or str(error) or type(error).__name__


def parse_target(text: str) -> tuple[str | None, str, int]:
    user, _, rest = text.rpartition("@")
    address, _, port = rest.partition(":")
    return user or None, address, int(port or 22)


class _HostKeyCheck(paramiko.MissingHostKeyPolicy):
    """Called by paramiko for every key (thermab hands it no host keys of its own, so
    nothing is checked twice): judges it against the known_hosts files."""

    def __init__(self, ssh: SshTransport, known: known_hosts.KnownHosts, address: str, port: int):
        self.ssh, self.known, self.address, self.port = ssh, known, address, port

    def missing_host_key(self, client, hostname, key):
        ssh = self.ssh
        blob = key.public_blob.key_blob if key.public_blob else key.asbytes()
        key_type = key.public_blob.key_type if key.public_blob else key.get_name()
        try:
            verdict = known_hosts.verify(self.known, self.address, self.port, key_type, blob)
        except (known_hosts.HostKeyError, ValueError) as error:
            raise RefusedError(ssh.host, f"{error}; refusing to connect") from None
        for note in verdict.notes:
            ssh.progress(f"host {ssh.host}: {note}")
        if verdict.trusted:
            return
        name = known_hosts.host_name(self.address, self.port)
        shown = f"{verdict.key_type} key {known_hosts.fingerprint(verdict.key_blob)}"
        if ssh.host_key_policy != "accept-new":
            files = " or ".join(str(f) for f in ssh.read_files)
            port = f"-p {self.port} " if self.port != 22 else ""
            raise RefusedError(
                ssh.host,
                f"the host key of {name} ({shown}) is not pinned in {files}; "
                f"check that fingerprint with the host's owner, then pin it "
                f"(ssh-keyscan {port}{self.address} >> {ssh.pin_file}) or set "
                "host_key_policy: accept-new for this host",
            ) from None
        known_hosts.append(ssh.pin_file, name, verdict.key_type, verdict.key_blob)
        ssh.progress(f"host {ssh.host}: new {shown} of {name} accepted and appended to {ssh.pin_file}")


class _OrderedTransport(paramiko.Transport):
    """Asks for the host key types known for the host first, as OpenSSH does, so a
    server with several keys presents the pinned one (or its certificate)."""

    def __init__(self, sock, order, **kwargs):
        self._order = order
        super().__init__(sock, **kwargs)

    @property
    def preferred_keys(self):
        return tuple(self._order(list(super().preferred_keys)))


class SshTransport:
    def __init__(
        self,
        host: str,
        address: str,
        *,
        port: int = 22,
        user: str | None = None,
        key_file: str | None = None,
        known_hosts: str | None = None,
        host_key_policy: str = "strict",
        jump: str | None = None,
        connect_timeout: float = 15,
        keepalive_s: int = 15,
        retries: int = 3,
        own_known_hosts: str | Path = OWN_KNOWN_HOSTS,
        progress=print,
    ):
        self.host = host
        self.address, self.port = address, port
        self.user = user or getpass.getuser()
        self.key_file = os.path.expanduser(key_file) if key_file else None
        # normalised as written (a link loop is for the read to report, not a traceback here)
        own = Path(os.path.abspath(own_known_hosts))
        named = Path(os.path.abspath(os.path.expanduser(known_hosts))) if known_hosts else None
        user_file = named or Path(os.path.expanduser(USER_KNOWN_HOSTS))
        # read: the user's file (or the one named) and thermab's own; written (accept-new
        # only, append only): the named file, else thermab's own, never ~/.ssh/known_hosts
        self.read_files = list(dict.fromkeys([user_file, own]))
        self.pin_file = named or own
        self.host_key_policy = host_key_policy
        self.jump = jump
        self.connect_timeout = connect_timeout
        self.keepalive_s = keepalive_s
        self.retries = retries
        self.progress = progress
        self._client: paramiko.SSHClient | None = None
        self._jump_client: paramiko.SSHClient | None = None

    @classmethod
    def from_spec(cls, spec, progress=print) -> SshTransport:
        s = spec.settings
        return cls(
            spec.name,
            s["address"],
            port=s.get("port", 22),
            user=s.get("user"),
            key_file=s.get("key_file"),
            known_hosts=s.get("known_hosts"),
            host_key_policy=s.get("host_key_policy", "strict"),
            jump=s.get("jump"),
            connect_timeout=s.get("connect_timeout_s", 15),
            progress=progress,
        )

    # -- connection ----------------------------------------------------------------------

    def _socket(self, address: str, port: int) -> socket.socket:
        try:
            return socket.create_connection((address, port), timeout=self.connect_timeout)
        except OSError as error:
            raise TransportError(
                self.host, f"cannot reach {address}:{port}: {describe_socket_error(error, self.connect_timeout)}"
            ) from None

    def _connect_once(self) -> paramiko.SSHClient:
        if self.jump:
            jump_user, jump_address, jump_port = parse_target(self.jump)
            self._jump_client = self._open(
                jump_address, jump_port, jump_user or self.user, self._socket(jump_address, jump_port)
            )
            try:
                sock = self._jump_client.get_transport().open_channel(
                    "direct-tcpip", (self.address, self.port), ("127.0.0.1", 0), timeout=self.connect_timeout
                )
            except paramiko.SSHException as error:
                reason = error.text if isinstance(error, paramiko.ChannelException) else str(error)
                raise TransportError(
                    self.host, f"jump host {jump_address}:{jump_port} cannot reach {self.address}:{self.port}: {reason}"
                ) from None
        else:
            sock = self._socket(self.address, self.port)
        client = self._open(self.address, self.port, self.user, sock)
        client.get_transport().set_keepalive(self.keepalive_s)
        return client

    def _open(self, address: str, port: int, user: str, sock) -> paramiko.SSHClient:
        where = f"{user}@{address}:{port}"
        if self.key_file and not os.path.exists(self.key_file):
            raise RefusedError(self.host, f"key_file {self.key_file} does not exist")
        if self.key_file:  # paramiko opens it itself: a FIFO would hang it, a device feed it forever
            try:
                check_file(self.key_file, MAX_KEY_BYTES)
            except UserError as error:
                raise RefusedError(self.host, f"key_file {error}") from None
        # read afresh for every connection: another job may have pinned a key since
        known = known_hosts.KnownHosts(self.read_files)
        name = known_hosts.host_name(address, port)
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(_HostKeyCheck(self, known, address, port))
        try:
            client.connect(
                address,
                port=port,
                username=user,
                key_filename=self.key_file,
                sock=sock,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                allow_agent=True,
                look_for_keys=self.key_file is None,
                transport_factory=lambda s, **kw: _OrderedTransport(
                    s, lambda offered: known_hosts.preferred_key_types(known, name, offered), **kw
                ),
            )
        except TransportError:
            client.close()
            raise
        except paramiko.PasswordRequiredException:
            client.close()
            raise RefusedError(
                self.host,
                f"authentication to {where} failed: key_file {self.key_file} needs a "
                "passphrase, which thermab never asks for; load it into the ssh-agent "
                f"(ssh-add {self.key_file})",
            ) from None
        except paramiko.AuthenticationException:
            client.close()
            raise RefusedError(
                self.host,
                f"authentication to {where} failed: the server accepted none of the "
                f"keys offered ({self._keys_offered()})",
            ) from None
        except paramiko.SSHException as error:
            client.close()
            if "No authentication methods available" in str(error):
                raise RefusedError(
                    self.host, f"authentication to {where} failed: no key to offer ({self._keys_offered()} found none)"
                ) from None
            if "banner" in str(error):
                if not isinstance(error.__context__, socket.timeout):  # it answered, then hung up or reset
                    raise TransportError(
                        self.host,
                        f"{address}:{port} answered, but is not an SSH server (it "
                        "closed without an SSH greeting): a wrong port?",
                    ) from None
                raise TransportError(
                    self.host,
                    f"no SSH server answered on {address}:{port} within "
                    f"{self.connect_timeout:g} s (no SSH greeting: a wrong port, or "
                    "a server too busy to answer)",
                ) from None
            raise TransportError(self.host, f"SSH handshake with {where} failed: {error}") from None
        except OSError as error:
            client.close()
            raise TransportError(
                self.host, f"connection to {where} broke: {describe_socket_error(error, self.connect_timeout)}"
            ) from None
        return client

    def _keys_offered(self) -> str:
        if self.key_file:
            return f"key_file {self.key_file}, then the ssh-agent's keys"
        return "the ssh-agent's keys, then ~/.ssh/id_rsa, id_ecdsa, id_ed25519"

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
                self.close()
                raise
            except TransportError as error:
                self.close()
                if attempt == self.retries:
                    raise
                self.progress(f"{error}; retrying in {delay:.0f} s ({attempt}/{self.retries})")
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

    def run(self, command: str, *, timeout: float = 60, check: bool = True, input: str | None = None) -> Result:
        channel = self._start(command)
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        try:
            if input is not None:  # data too large for a command line goes on stdin
                channel.sendall(input.encode())
                channel.shutdown_write()
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

    def open_lines(self, command: str) -> _SshLines:
        return _SshLines(self.host, command, self._start(command))

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


class _SshLines(LineReader):
    def __init__(self, host: str, command: str, channel: paramiko.Channel):
        self.host, self.command, self.channel = host, command, channel

    def send(self, data: bytes) -> None:
        try:
            self.channel.sendall(data)
        except CONNECTION_LOST as error:
            raise TransportError(self.host, f"connection lost during {self.command!r}: {error}") from None

    def _receive(self, left: float) -> bytes | None:
        self.channel.settimeout(max(left, 0.001))
        try:
            return self.channel.recv(4096)
        except TimeoutError:
            return None

    def close(self) -> None:
        self.channel.close()
