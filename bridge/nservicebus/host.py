"""Who the bridge is to ServiceControl: its host's name and a host id, as NServiceBus has them.

An NServiceBus endpoint names its host in every error copy (`$.diagnostics.hostid`,
`$.diagnostics.hostdisplayname`, `NServiceBus.ProcessingMachine`); ServiceControl files the
failure under that endpoint instance, and registers the instance, only when the host id is a
Guid other than empty. NServiceBus derives the id from where the program is installed and the
machine's name, so the same installation on the same machine always has the same id, and any
other has another: the MD5 hash of the two texts, UTF-8, joined, read as the bytes of a .NET
Guid (what `new Guid(byte[])` does: the first three fields little-endian), written in the
"N" format, 32 lowercase hex digits. The bridge does the same with the directory its
`bridge` package is installed in and the host name (`socket.gethostname()`, which is the pod's
name under Kubernetes, as it is for an NServiceBus endpoint there).
"""

from __future__ import annotations

import hashlib
import socket
import uuid
from functools import cache
from pathlib import Path

__all__ = ["host_id", "host_name", "make_host_id"]


def make_host_id(install_path: str, host: str) -> str:
    """The host id NServiceBus would give a program installed at `install_path` on `host`."""
    digest = hashlib.md5((install_path + host).encode("utf-8"), usedforsecurity=False).digest()
    return uuid.UUID(bytes_le=digest).hex


@cache
def host_name() -> str:
    return socket.gethostname()


@cache
def host_id() -> str:
    """This bridge installation's id on this host (see the module docstring)."""
    return make_host_id(str(Path(__file__).resolve().parent.parent), host_name())
