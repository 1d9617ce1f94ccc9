"""The asyncio client: `gangway_client.Client`'s calls as coroutines and its watches as
async iterators, with the same moves across replicas and resumption from the last
version received.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable, List, Optional, Sequence

import grpc
from grpc import aio

from ._connection import PASSES_MAX, TERMINAL_STATES, TRANSIENT, ClientBase, GangwayError, backoff_s
from ._proto import inventory_pb2 as inv
from ._proto import inventory_pb2_grpc as inv_grpc
from ._proto import scheduler_pb2 as pb
from ._proto import scheduler_pb2_grpc as pb_grpc


class Client(ClientBase):
    """An asyncio client of gangway's replicas; the options are `ClientBase`'s. Use
    `async with Client([...]) as client:` or call `close()`."""

    _channel: Optional[aio.Channel] = None

    def _open(self) -> None:
        host, creds, options = self._target()
        if creds is not None:
            self._channel = aio.secure_channel(host, creds, options=options)
        else:
            self._channel = aio.insecure_channel(host, options=options)
        self._scheduler = pb_grpc.SchedulerStub(self._channel)
        self._inventory = inv_grpc.InventoryStub(self._channel)

    async def _next_replica(self) -> None:
        await self.close()
        self._advance()
        self._open()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(self, call: Callable, request: object):
        tries = PASSES_MAX * len(self._endpoints)
        last: Optional[aio.AioRpcError] = None
        for attempt in range(tries):
            if attempt and attempt % len(self._endpoints) == 0:
                await asyncio.sleep(backoff_s(attempt // len(self._endpoints)))
            try:
                return await call(self)(request, timeout=self._timeout_s, metadata=self._metadata)
            except aio.AioRpcError as e:
                if e.code() not in TRANSIENT:
                    raise GangwayError(e.code(), e.details() or "") from None
                last = e
                await self._next_replica()
        assert last is not None
        raise GangwayError(last.code(), f"every replica failed; the last said: {last.details()}")

    async def submit(self, request: pb.SubmitGangGroupRequest) -> pb.GangGroupStatus:
        return await self._unary(lambda c: c._scheduler.SubmitGangGroup, self._keyed(request))

    async def get(self, group_id: int) -> pb.GangGroupStatus:
        return await self._unary(lambda c: c._scheduler.GetGangGroup, pb.GangGroupRef(id=group_id))

    async def cancel(self, group_id: int) -> pb.GangGroupStatus:
        return await self._unary(lambda c: c._scheduler.CancelGangGroup, pb.GangGroupRef(id=group_id))

    async def release(self, group_id: int) -> pb.GangGroupStatus:
        return await self._unary(lambda c: c._scheduler.ReleaseGangGroup, pb.GangGroupRef(id=group_id))

    async def release_members(self, group_id: int, members: Sequence[str]) -> pb.GangGroupStatus:
        request = pb.ReleaseMembersRequest(id=group_id, members=list(members))
        return await self._unary(lambda c: c._scheduler.ReleaseMembers, request)

    async def list_groups(self, include_finished: bool = False) -> List[pb.GangGroupStatus]:
        request = pb.ListGangGroupsRequest(include_finished=include_finished)
        return list((await self._unary(lambda c: c._scheduler.ListGangGroups, request)).groups)

    async def register_node(self, node: inv.NodeSpec, update: bool = True) -> inv.NodeInfo:
        request = inv.RegisterNodeRequest(node=node, update=update)
        return (await self._unary(lambda c: c._inventory.RegisterNode, request)).node

    async def watch(self, group_id: int, after_version: int = 0) -> AsyncIterator[pb.GangGroupStatus]:
        """As the sync client's `watch`."""
        request = pb.WatchGangGroupRequest(id=group_id, after_version=after_version)
        async for status in self._stream(lambda c: c._scheduler.WatchGangGroup, request):
            yield status
            if status.state in TERMINAL_STATES:
                return

    async def watch_groups(
        self, namespace: str = "", queue: str = "", after_version: int = 0
    ) -> AsyncIterator[pb.GangGroupStatus]:
        """As the sync client's `watch_groups`."""
        request = pb.WatchGangGroupsRequest(namespace=namespace, queue=queue, after_version=after_version)
        async for status in self._stream(lambda c: c._scheduler.WatchGangGroups, request):
            yield status

    async def wait(self, group_id: int, until: Callable[[pb.GangGroupStatus], bool]) -> pb.GangGroupStatus:
        last = None
        async for status in self.watch(group_id):
            last = status
            if until(status):
                return status
        if last is None:
            raise GangwayError(grpc.StatusCode.UNAVAILABLE, "the watch ended before any status")
        return last

    async def _stream(self, call, request) -> AsyncIterator:
        failures = 0
        while True:
            try:
                async for status in call(self)(request, metadata=self._metadata):
                    failures = 0
                    request.after_version = max(request.after_version, status.version)
                    yield status
                return
            except aio.AioRpcError as e:
                if e.code() not in TRANSIENT:
                    raise GangwayError(e.code(), e.details() or "") from None
                failures += 1
                if failures > PASSES_MAX * len(self._endpoints):
                    raise GangwayError(e.code(), f"every replica failed; the last said: {e.details()}") from None
                await self._next_replica()
                if failures % len(self._endpoints) == 0:
                    await asyncio.sleep(backoff_s(failures // len(self._endpoints)))
