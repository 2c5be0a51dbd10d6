"""A TCP relay to a Unix socket: `python -m tests.relay HOST PORT PATH`.

The network tests run it inside a network namespace (`tests.helpers.Partition`), so that
the connections a test makes to PostgreSQL cross a link the test can cut. Prints "ready"
once it listens."""

from __future__ import annotations

import socket
import sys
import threading
from contextlib import suppress


def pump(source: socket.socket, target: socket.socket) -> None:
    """Copy `source` to `target` until either ends; then end both."""
    with suppress(OSError):
        while data := source.recv(65536):
            target.sendall(data)
    for end in (source, target):
        with suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)


def main(host: str, port: int, path: str) -> None:
    server = socket.create_server((host, port))
    print("ready", flush=True)
    while True:
        client, _ = server.accept()
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            upstream.close()
            continue
        for source, target in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(source, target), daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
