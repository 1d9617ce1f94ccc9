"""The synchronous client: one channel to one replica at a time; a call that finds it
down (or its answer lost) moves to the next replica and tries again, and a watch resumes
there from the last version it received, so a replica's failure costs the caller
nothing but a moment. Submissions carry an idempotency key (made here if absent), so a
retried submission never makes a second group.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, List, Optional, Sequence

import grpc

from ._connection import (
    CALL_TIMEOUT_S,
    PASSES_MAX,
    TERMINAL_STATES,
    TRANSIENT,
    GangwayError,
    Tls,
    backoff_s,
    channel_options,
    check_endpoints,
    metadata,
    new_idempotency_key,
    read_token,
    target,
)
from ._proto import inventory_pb2 as inv
from ._proto import inventory_pb2_grpc as inv_grpc
from ._proto import scheduler_pb2 as pb
from ._proto import scheduler_pb2_grpc as pb_grpc


class Client:
    """A client of gangway's replicas (`endpoints`: every replica it may use, such as
    `http://10.0.0.1:50051`; `https://` or `tls` for TLS; `token` or `token_file` for a
    bearer token)."""

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
        self._channel: Optional[grpc.Channel] = None
        self._open()

    @property
    def endpoint(self) -> str:
        """The replica calls go to now."""
        return self._endpoints[self._index]

    def _open(self) -> None:
        host, secure = target(self.endpoint)
        options = channel_options(self._tls)
        if secure or self._tls is not None:
            creds = self._tls.credentials() if self._tls else grpc.ssl_channel_credentials()
            self._channel = grpc.secure_channel(host, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(host, options=options)
        self._scheduler = pb_grpc.SchedulerStub(self._channel)
        self._inventory = inv_grpc.InventoryStub(self._channel)

    def _next_replica(self) -> None:
        self.close()
        self._index = (self._index + 1) % len(self._endpoints)
        self._open()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(self, call: Callable[[object], Callable], request: object):
        """Runs one call, moving through the replicas while they fail transiently."""
        tries = PASSES_MAX * len(self._endpoints)
        last: Optional[grpc.RpcError] = None
        for attempt in range(tries):
            if attempt and attempt % len(self._endpoints) == 0:
                time.sleep(backoff_s(attempt // len(self._endpoints)))
            try:
                return call(self)(request, timeout=self._timeout_s, metadata=self._metadata)
            except grpc.RpcError as e:
                if e.code() not in TRANSIENT:
                    raise GangwayError(e.code(), e.details() or "") from None
                last = e
                self._next_replica()
        assert last is not None
        raise GangwayError(last.code(), f"every replica failed; the last said: {last.details()}")

    def submit(self, request: pb.SubmitGangGroupRequest) -> pb.GangGroupStatus:
        """Submits a gang group; the same idempotency key always yields the same group."""
        if not request.idempotency_key:
            request = _copy(request)
            request.idempotency_key = new_idempotency_key(request.name)
        return self._unary(lambda c: c._scheduler.SubmitGangGroup, request)

    def get(self, group_id: int) -> pb.GangGroupStatus:
        return self._unary(lambda c: c._scheduler.GetGangGroup, pb.GangGroupRef(id=group_id))

    def cancel(self, group_id: int) -> pb.GangGroupStatus:
        """Cancels a gang group; whatever it holds is released."""
        return self._unary(lambda c: c._scheduler.CancelGangGroup, pb.GangGroupRef(id=group_id))

    def release(self, group_id: int) -> pb.GangGroupStatus:
        """Work finished: gives back everything the group holds."""
        return self._unary(lambda c: c._scheduler.ReleaseGangGroup, pb.GangGroupRef(id=group_id))

    def release_members(self, group_id: int, members: Sequence[str]) -> pb.GangGroupStatus:
        """Gives back what these members (`namespace/gang/member`) hold; the rest stay."""
        request = pb.ReleaseMembersRequest(id=group_id, members=list(members))
        return self._unary(lambda c: c._scheduler.ReleaseMembers, request)

    def list_groups(self, include_finished: bool = False) -> List[pb.GangGroupStatus]:
        request = pb.ListGangGroupsRequest(include_finished=include_finished)
        return list(self._unary(lambda c: c._scheduler.ListGangGroups, request).groups)

    def register_node(self, node: inv.NodeSpec, update: bool = True) -> inv.NodeInfo:
        """Registers (or with `update`, changes) a node gangway does not learn from Kubernetes."""
        request = inv.RegisterNodeRequest(node=node, update=update)
        return self._unary(lambda c: c._inventory.RegisterNode, request).node

    def watch(self, group_id: int, after_version: int = 0) -> Iterator[pb.GangGroupStatus]:
        """The group's statuses after `after_version` (0: its current one first), then
        each change, until it ends; on a replica's failure it resumes on the next from
        the last version received, so nothing is missed and nothing comes twice."""
        request = pb.WatchGangGroupRequest(id=group_id, after_version=after_version)
        for status in self._stream(lambda c: c._scheduler.WatchGangGroup, request):
            yield status
            if status.state in TERMINAL_STATES:
                return

    def watch_groups(
        self, namespace: str = "", queue: str = "", after_version: int = 0
    ) -> Iterator[pb.GangGroupStatus]:
        """Every change of the groups of `namespace` and `queue` (empty: any) after
        `after_version` (0: first every group gangway keeps), as it comes; resumed across
        replicas as `watch` is. Endless: stop iterating to leave."""
        request = pb.WatchGangGroupsRequest(namespace=namespace, queue=queue, after_version=after_version)
        yield from self._stream(lambda c: c._scheduler.WatchGangGroups, request)

    def wait(
        self, group_id: int, until: Callable[[pb.GangGroupStatus], bool]
    ) -> pb.GangGroupStatus:
        """Follows the group until `until` accepts a status or the group ends."""
        last = None
        for status in self.watch(group_id):
            last = status
            if until(status):
                return status
        if last is None:
            raise GangwayError(grpc.StatusCode.UNAVAILABLE, "the watch ended before any status")
        return last

    def _stream(self, call, request) -> Iterator:
        """A server stream resumed across replicas from the last version received."""
        failures = 0
        while True:
            try:
                for status in call(self)(request, metadata=self._metadata):
                    failures = 0
                    request.after_version = max(request.after_version, status.version)
                    yield status
                return
            except grpc.RpcError as e:
                if e.code() not in TRANSIENT:
                    raise GangwayError(e.code(), e.details() or "") from None
                failures += 1
                if failures > PASSES_MAX * len(self._endpoints):
                    raise GangwayError(e.code(), f"every replica failed; the last said: {e.details()}") from None
                self._next_replica()
                if failures % len(self._endpoints) == 0:
                    time.sleep(backoff_s(failures // len(self._endpoints)))


def _copy(request: pb.SubmitGangGroupRequest) -> pb.SubmitGangGroupRequest:
    out = pb.SubmitGangGroupRequest()
    out.CopyFrom(request)
    return out
