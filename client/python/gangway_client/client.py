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

from ._connection import PASSES_MAX, TERMINAL_STATES, TRANSIENT, ClientBase, GangwayError, backoff_s
from ._proto import inventory_pb2 as inv
from ._proto import inventory_pb2_grpc as inv_grpc
from ._proto import scheduler_pb2 as pb
from ._proto import scheduler_pb2_grpc as pb_grpc


class Client(ClientBase):
    """A client of gangway's replicas; the options are `ClientBase`'s."""

    _channel: Optional[grpc.Channel] = None

    def _open(self) -> None:
        host, creds, options = self._target()
        if creds is not None:
            self._channel = grpc.secure_channel(host, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(host, options=options)
        self._scheduler = pb_grpc.SchedulerStub(self._channel)
        self._inventory = inv_grpc.InventoryStub(self._channel)

    def _next_replica(self) -> None:
        self.close()
        self._advance()
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
        return self._unary(lambda c: c._scheduler.SubmitGangGroup, self._keyed(request))

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

