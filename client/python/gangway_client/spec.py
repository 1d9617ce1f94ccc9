"""Typed builders for gang group submissions, as gangway_client::spec in Rust: a group
of gangs, each gang of member templates with a pod spec in Kubernetes field names.

Pure: builds `SubmitGangGroupRequest` messages, checks nothing the server checks (the
server names the field at fault in its INVALID_ARGUMENT answer).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence

from ._proto import scheduler_pb2 as pb

#: The modes a gang accumulates its members in (Koordinator's).
MODES = ("Strict", "NonStrict")


class GangBuilder:
    """One gang: members placed together, at least `min_member` of them."""

    def __init__(self, namespace: str, name: str, min_member: int) -> None:
        self._gang = pb.GangSpec(name=name, namespace=namespace, min_member=min_member)

    def non_strict(self) -> "GangBuilder":
        """NonStrict: placed members stay while the rest arrive."""
        self._gang.mode = "NonStrict"
        return self

    def total_number(self, n: int) -> "GangBuilder":
        """Members the gang will have (default: those given)."""
        self._gang.total_number = n
        return self

    def wait_time_ms(self, ms: int) -> "GangBuilder":
        """Give up this long after submission if still unplaced (0: 600 s)."""
        self._gang.wait_time_ms = ms
        return self

    def priority(self, priority: int) -> "GangBuilder":
        self._gang.priority = priority
        return self

    def required_topology(self, key: str) -> "GangBuilder":
        """Every member in one domain of node label `key`."""
        self._gang.topology.required = key
        return self

    def preferred_topology(self, key: str) -> "GangBuilder":
        """As few domains of node label `key` as possible."""
        self._gang.topology.preferred = key
        return self

    def topology_slices(self, key: str, size: int) -> "GangBuilder":
        """Consecutive slices of `size` members, each in one domain of `key`."""
        self._gang.topology.slice_key = key
        self._gang.topology.slice_size = size
        return self

    def members(self, name: str, count: int, pod: Optional[Dict[str, Any]] = None) -> "GangBuilder":
        """`count` members named `name-0..` (`name` for one) with this pod spec
        (requests, nodeSelector, affinity, tolerations, ... as Kubernetes spells them)."""
        self._gang.members.append(pb.MemberSpec(name=name, count=count, pod_json=_pod(pod)))
        return self

    def kubernetes_pods(self, name: str, count: int, pod: Optional[Dict[str, Any]] = None) -> "GangBuilder":
        """`count` members standing for the Kubernetes pods `name-0..` of the gang's
        namespace, which the framework creates with gangway's schedulerName and the
        annotation gangway.io/group set to the group's name. gangway binds them once all
        of the group's named pods exist and ask what their members ask."""
        self._gang.members.append(
            pb.MemberSpec(name=name, count=count, pod_json=_pod(pod), pods=pb.KubernetesPods())
        )
        return self

    def kubernetes_pods_selected(
        self, name: str, count: int, selector: Dict[str, str], pod: Optional[Dict[str, Any]] = None
    ) -> "GangBuilder":
        """`count` members (`name-0..`) standing for any `count` pods of the gang's
        namespace with every label of `selector` (see `kubernetes_pods`): once that many
        exist, gangway picks them in name order and keeps the choice."""
        self._gang.members.append(
            pb.MemberSpec(
                name=name, count=count, pod_json=_pod(pod), pods=pb.KubernetesPods(selector=selector)
            )
        )
        return self

    def kubernetes_pods_named(self, names: Sequence[str], pod: Optional[Dict[str, Any]] = None) -> "GangBuilder":
        """One member per pod in `names`, each named as its pod (see `kubernetes_pods`)."""
        self._gang.members.append(
            pb.MemberSpec(pod_json=_pod(pod), pods=pb.KubernetesPods(names=list(names)))
        )
        return self

    def build(self) -> pb.GangSpec:
        out = pb.GangSpec()
        out.CopyFrom(self._gang)
        return out


class GangGroupBuilder:
    """A gang group: its gangs are placed all together or not at all."""

    def __init__(self, name: str) -> None:
        self._request = pb.SubmitGangGroupRequest(name=name)

    def idempotency_key(self, key: str) -> "GangGroupBuilder":
        """The same key always yields the same group (default: the client makes one)."""
        self._request.idempotency_key = key
        return self

    def queue(self, queue: str) -> "GangGroupBuilder":
        self._request.queue = queue
        return self

    def run_limit_seconds(self, seconds: int) -> "GangGroupBuilder":
        """The longest the group runs once placed; gangway releases it then."""
        self._request.run_limit_seconds = seconds
        return self

    def gang(self, gang: GangBuilder) -> "GangGroupBuilder":
        self._request.gangs.append(gang.build())
        return self

    def build(self) -> pb.SubmitGangGroupRequest:
        out = pb.SubmitGangGroupRequest()
        out.CopyFrom(self._request)
        return out


def _pod(pod: Optional[Dict[str, Any]]) -> str:
    return "" if pod is None else json.dumps(pod, sort_keys=True)


def placements(status: pb.GangGroupStatus) -> Dict[str, str]:
    """Member (`namespace/gang/member`) → node, for a status's placed members."""
    return {f"{p.namespace}/{p.gang}/{p.member}": p.node for p in status.placements}


__all__: List[str] = ["GangBuilder", "GangGroupBuilder", "MODES", "placements"]
