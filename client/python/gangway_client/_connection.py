"""What the sync and asyncio clients share: endpoints, credentials, which failures move
to another replica, idempotency keys and backoff. Pure apart from reading files named
in the options.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import grpc

#: States in which a gang group has ended: a watch stops there.
TERMINAL_STATES = frozenset({"Released", "Cancelled", "TimedOut", "Preempted"})
#: Codes after which a call is tried on the next replica (a replica down, a leader
#: moving, an answer lost).
TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN})
#: Passes over every endpoint before a call gives up.
PASSES_MAX = 5
#: First wait between passes, in seconds; doubles each pass.
BACKOFF_S = 0.2
#: Longest a unary call waits for its answer, in seconds (by default).
CALL_TIMEOUT_S = 10.0
#: Largest reply accepted, in bytes (a listing of many groups).
REPLY_BYTES_MAX = 64 << 20


@dataclass(frozen=True)
class Tls:
    """TLS to the replicas: the CA that signed their certificates, and optionally this
    client's own certificate and key (mutual TLS), as PEM file paths."""

    ca_file: str
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    #: The name the replicas' certificates carry, when it is not the endpoint's host.
    server_name: Optional[str] = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Optional[str]) -> Optional[bytes]:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )


class GangwayError(Exception):
    """A call gangway refused or that failed on every replica: `code` is the gRPC status
    code, `message` gangway's reason (it names the field at fault for bad input)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


def target(endpoint: str) -> Tuple[str, bool]:
    """(host:port, whether the scheme asks for TLS) of `http://h:p`, `https://h:p` or `h:p`."""
    if endpoint.startswith("https://"):
        return endpoint[len("https://"):].rstrip("/"), True
    if endpoint.startswith("http://"):
        return endpoint[len("http://"):].rstrip("/"), False
    return endpoint.rstrip("/"), False


def channel_options(tls: Optional[Tls]) -> List[Tuple[str, object]]:
    options: List[Tuple[str, object]] = [("grpc.max_receive_message_length", REPLY_BYTES_MAX)]
    if tls is not None and tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return options


def metadata(token: Optional[str]) -> Sequence[Tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def read_token(token: Optional[str], token_file: Optional[str]) -> Optional[str]:
    if token is not None and token_file is not None:
        raise ValueError("token and token_file: give one or the other")
    if token_file is not None:
        with open(token_file, encoding="utf-8") as f:
            return f.read().strip()
    return token


def check_endpoints(endpoints: Sequence[str]) -> List[str]:
    if isinstance(endpoints, str):
        endpoints = [endpoints]
    out = [e for e in endpoints if e]
    if not out:
        raise ValueError("endpoints: at least one replica's address, such as http://127.0.0.1:50051")
    return out


def new_idempotency_key(name: str) -> str:
    return f"{name}-{time.time_ns()}-{os.getpid()}"


class ClientBase:
    """What the sync and asyncio clients keep alike: the replicas (`endpoints`: every
    replica the client may use, such as `http://10.0.0.1:50051`; `https://` or `tls` for
    TLS; `token` or `token_file` for a bearer token), and which one is in use. A
    subclass opens its channel in `_open`."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        token: Optional[str] = None,
        token_file: Optional[str] = None,
        tls: Optional[Tls] = None,
        timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        self._endpoints = check_endpoints(endpoints)
        self._metadata = metadata(read_token(token, token_file))
        self._tls = tls
        self._timeout_s = timeout_s
        self._index = 0
        self._open()

    @property
    def endpoint(self) -> str:
        """The replica calls go to now."""
        return self._endpoints[self._index]

    def _open(self) -> None:
        raise NotImplementedError("a client opens its own kind of channel")

    def _target(self) -> Tuple[str, Optional[grpc.ChannelCredentials], List[Tuple[str, object]]]:
        """The replica in use: its address, credentials (None: plaintext) and options."""
        host, secure = target(self.endpoint)
        creds = None
        if secure or self._tls is not None:
            creds = self._tls.credentials() if self._tls else grpc.ssl_channel_credentials()
        return host, creds, channel_options(self._tls)

    def _advance(self) -> None:
        self._index = (self._index + 1) % len(self._endpoints)

    @staticmethod
    def _keyed(request):
        """`request` with an idempotency key (a copy with a new one if it had none), so a
        retried submission never makes a second group."""
        if request.idempotency_key:
            return request
        out = type(request)()
        out.CopyFrom(request)
        out.idempotency_key = new_idempotency_key(request.name)
        return out


def backoff_s(attempt: int) -> float:
    """The wait before pass `attempt` (0-based) over the endpoints."""
    return BACKOFF_S * (2 ** min(attempt, 6))
