"""gangway's Python client: typed builders for gang groups (`spec`), a synchronous
client (`Client`) and an asyncio one (`gangway_client.aio.Client`), both moving across
replicas when one fails and resuming watches from the last version received."""

from ._connection import TERMINAL_STATES, GangwayError, Tls
from ._proto import inventory_pb2, scheduler_pb2
from .client import Client
from .spec import GangBuilder, GangGroupBuilder, placements

__all__ = [
    "Client",
    "GangBuilder",
    "GangGroupBuilder",
    "GangwayError",
    "TERMINAL_STATES",
    "Tls",
    "inventory_pb2",
    "placements",
    "scheduler_pb2",
]
