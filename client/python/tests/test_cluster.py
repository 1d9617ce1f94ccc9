"""The client against three real `gangway serve` processes, which
server/tests/python_client.rs starts (with nodes registered) before running these:
GANGWAY_ENDPOINTS lists the replicas and GANGWAY_PIDS their process ids, in the same
order. The asyncio client submits, watches to Placed and releases; the sync client
watches a group, the replica it watches on is killed mid-stream, and the watch resumes
on another replica with no change missed or repeated. The kill comes last (tests run in
name order).
"""

import asyncio
import os
import signal
import unittest

from gangway_client import Client, GangBuilder, GangGroupBuilder, GangwayError, placements
from gangway_client import aio

ENDPOINTS = [e for e in os.environ.get("GANGWAY_ENDPOINTS", "").split(",") if e]
PIDS = [int(p) for p in os.environ.get("GANGWAY_PIDS", "").split(",") if p]


def group(name: str, members: int, cpu: str = "1"):
    return (
        GangGroupBuilder(name)
        .gang(GangBuilder("team-a", name, members).members("w", members, {"requests": {"cpu": cpu}}))
        .build()
    )


@unittest.skipUnless(ENDPOINTS and len(PIDS) == len(ENDPOINTS), "run by server/tests/python_client.rs")
class ClusterTest(unittest.TestCase):
    def test_1_asyncio_submits_watches_to_placed_and_releases(self):
        async def run():
            async with aio.Client(ENDPOINTS) as client:
                submitted = await client.submit(group("py-async", 2))
                placed = await client.wait(submitted.id, lambda s: s.state == "Placed")
                self.assertEqual(placed.state, "Placed", placed.reason)
                self.assertEqual(len(placements(placed)), 2)
                released = await client.release(submitted.id)
                self.assertIn(released.state, ("Releasing", "Released"))
                ended = await client.wait(submitted.id, lambda s: False)
                self.assertEqual(ended.state, "Released")

        asyncio.run(run())

    def test_2_bad_input_names_the_field(self):
        with Client(ENDPOINTS) as client:
            bad = group("py-bad", 1)
            bad.gangs[0].min_member = 0
            with self.assertRaises(GangwayError) as caught:
                client.submit(bad)
            self.assertIn("minMember", caught.exception.message)
            self.assertEqual(caught.exception.code.name, "INVALID_ARGUMENT")

    def test_3_a_watch_resumes_on_another_replica_when_its_own_is_killed(self):
        watcher = Client(ENDPOINTS)
        others = [e for e in ENDPOINTS if e != watcher.endpoint]
        actor = Client(others)
        submitted = actor.submit(group("py-sync", 2))
        stream = watcher.watch(submitted.id)
        seen = []
        for status in stream:
            seen.append(status)
            if status.state == "Placed":
                break
        self.assertEqual(seen[-1].state, "Placed", seen[-1].reason)
        victim = PIDS[ENDPOINTS.index(watcher.endpoint)]
        os.kill(victim, signal.SIGKILL)
        actor.release(submitted.id)
        for status in stream:
            seen.append(status)
        versions = [s.version for s in seen]
        self.assertEqual(versions, sorted(set(versions)), "nothing twice, in order")
        self.assertEqual(seen[-1].state, "Released", [s.state for s in seen])
        self.assertNotEqual(watcher.endpoint, ENDPOINTS[PIDS.index(victim)], "moved to another replica")
        # Everything after Placed arrived: the release's every step the watcher was told of
        # ends in Released, and a watch resumed from Placed's version says the same.
        placed_version = next(s.version for s in seen if s.state == "Placed")
        resumed = list(actor.watch(submitted.id, after_version=placed_version))
        self.assertEqual(resumed[-1].state, "Released")
        self.assertTrue(all(s.version > placed_version for s in resumed))
        watcher.close()
        actor.close()


if __name__ == "__main__":
    unittest.main()
