"""Unit tests of the builders and the connection options (no server)."""

import json
import unittest

from gangway_client import GangBuilder, GangGroupBuilder, placements, scheduler_pb2
from gangway_client._connection import check_endpoints, read_token, target


class BuildersTest(unittest.TestCase):
    def test_a_group_of_gangs_and_members(self):
        request = (
            GangGroupBuilder("train-1")
            .idempotency_key("k")
            .queue("research")
            .run_limit_seconds(600)
            .gang(
                GangBuilder("team-a", "workers", 4)
                .non_strict()
                .priority(7)
                .wait_time_ms(30_000)
                .required_topology("rack")
                .members("w", 4, {"requests": {"cpu": "2"}})
            )
            .build()
        )
        gang = request.gangs[0]
        self.assertEqual((request.name, request.idempotency_key, request.queue), ("train-1", "k", "research"))
        self.assertEqual(request.run_limit_seconds, 600)
        self.assertEqual((gang.namespace, gang.name, gang.min_member, gang.mode), ("team-a", "workers", 4, "NonStrict"))
        self.assertEqual((gang.priority, gang.wait_time_ms, gang.topology.required), (7, 30_000, "rack"))
        self.assertEqual(json.loads(gang.members[0].pod_json), {"requests": {"cpu": "2"}})
        self.assertFalse(gang.members[0].HasField("pods"), "plain members name no pod")

    def test_members_may_stand_for_kubernetes_pods(self):
        gang = (
            GangBuilder("train", "job", 3)
            .kubernetes_pods("w", 2, {"requests": {"cpu": "1"}})
            .kubernetes_pods_named(["chief"])
            .build()
        )
        self.assertTrue(gang.members[0].HasField("pods"))
        self.assertEqual(list(gang.members[0].pods.names), [])
        self.assertEqual(list(gang.members[1].pods.names), ["chief"])
        selected = GangBuilder("train", "job", 2).kubernetes_pods_selected("w", 2, {"app": "job"}).build()
        self.assertEqual(dict(selected.members[0].pods.selector), {"app": "job"})

    def test_a_builder_hands_out_copies(self):
        builder = GangGroupBuilder("g").gang(GangBuilder("ns", "a", 1).members("m", 1))
        first = builder.build()
        first.name = "changed"
        self.assertEqual(builder.build().name, "g")

    def test_placements_by_member(self):
        status = scheduler_pb2.GangGroupStatus(
            placements=[scheduler_pb2.MemberPlacement(namespace="ns", gang="g", member="m-0", node="n1")]
        )
        self.assertEqual(placements(status), {"ns/g/m-0": "n1"})


class ConnectionTest(unittest.TestCase):
    def test_endpoints_and_schemes(self):
        self.assertEqual(target("http://127.0.0.1:1/"), ("127.0.0.1:1", False))
        self.assertEqual(target("https://gangway:443"), ("gangway:443", True))
        self.assertEqual(target("10.0.0.1:50051"), ("10.0.0.1:50051", False))
        self.assertEqual(check_endpoints("h:1"), ["h:1"])
        with self.assertRaisesRegex(ValueError, "endpoints"):
            check_endpoints([])

    def test_a_token_or_a_token_file_not_both(self):
        with self.assertRaisesRegex(ValueError, "token and token_file"):
            read_token("t", "/dev/null")
        self.assertEqual(read_token("t", None), "t")


if __name__ == "__main__":
    unittest.main()
