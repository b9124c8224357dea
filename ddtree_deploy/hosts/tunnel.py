"""Reach a TCP port on a host from this machine: directly, or through the host's SSH connection.

SGLang listens on loopback by default (`service.listen_host`), and GPU hosts sit behind
firewalls that let SSH through and little else, so the validation gates tunnel: each local
connection becomes a `direct-tcpip` channel of the already authenticated SSH transport to
`remote_host:remote_port` as seen from the host (what `ssh -L` does). A channel the host refuses
(nothing listening yet) closes the local connection, which HTTP clients see as a reset.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
from collections.abc import Iterator

import paramiko

from ddtree_deploy.errors import UnreachableHost
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.ssh import SshHost

log = logging.getLogger(__name__)
_CHUNK = 65536


@contextlib.contextmanager
def forwarded_port(host: ShellHost, remote_host: str, remote_port: int) -> Iterator[int]:
    """A port on 127.0.0.1 of this machine that reaches `remote_host:remote_port` via `host`.

    For a local host it is `remote_port` itself. Raises `UnreachableHost` if SSH is down.
    """
    if not isinstance(host, SshHost):
        yield remote_port
        return
    transport = _transport(host)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()
    acceptor = threading.Thread(
        target=_accept, args=(listener, transport, (remote_host, remote_port), stop), daemon=True
    )
    acceptor.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        listener.close()
        acceptor.join(timeout=5)


def _transport(host: SshHost) -> paramiko.Transport:
    connection = host._connection  # the room's own transport object (hosts owns Fabric)
    try:
        connection.open()
    except (OSError, EOFError, paramiko.SSHException) as err:
        raise UnreachableHost(
            f"Cannot open an SSH tunnel to {host.name} ({type(err).__name__}: {err})."
        ) from err
    transport = connection.transport
    assert transport is not None, "an open Fabric connection has a transport"
    return transport


def _accept(
    listener: socket.socket,
    transport: paramiko.Transport,
    target: tuple[str, int],
    stop: threading.Event,
) -> None:
    while not stop.is_set():
        try:
            ready, _, _ = select.select([listener], [], [], 0.2)
            if not ready:
                continue
            client, _ = listener.accept()
        except (OSError, ValueError):  # listener closed under us: we are stopping
            return
        threading.Thread(target=_serve, args=(client, transport, target), daemon=True).start()


def _serve(client: socket.socket, transport: paramiko.Transport, target: tuple[str, int]) -> None:
    try:
        channel = transport.open_channel("direct-tcpip", target, client.getsockname())
    except (paramiko.SSHException, OSError, EOFError) as err:
        log.debug("tunnel to %s:%s refused: %s", *target, err)
        client.close()
        return
    with contextlib.closing(client), contextlib.closing(channel):
        _pump(client, channel)


def _pump(client: socket.socket, channel: paramiko.Channel) -> None:
    """Copy bytes both ways until either side closes."""
    while True:
        ready, _, _ = select.select([client, channel], [], [], 1.0)
        for source, sink in ((client, channel), (channel, client)):
            if source in ready:
                try:
                    data = source.recv(_CHUNK)
                except OSError:
                    return
                if not data:
                    return
                sink.sendall(data)
        if channel.closed or _transport_gone(channel):
            return


def _transport_gone(channel: paramiko.Channel) -> bool:
    transport = channel.get_transport()
    return transport is None or not transport.is_active()
