#!/usr/bin/env python3
"""batch_job: runs a batch job of N workers on Kubernetes through gangway's gRPC API, as
a batch framework's controller does.

1. Creates the workers' pods, NAME-0 .. NAME-(N-1), with gangway's schedulerName, the
   annotation gangway.io/group=NAME (so gangway's Kubernetes ingest leaves them to the
   group) and the label gangway.io/job=NAME.
2. Submits the gang group NAME: one Strict gang whose members stand for those pods.
   gangway places it whole, then binds every pod to its member's node.
3. Watches the group (resuming across gangway's replicas) and the pods: says why it
   waits, when it is placed, when every pod is bound.
4. Cleans up: when every worker Succeeded it releases the group and deletes the pods
   (exit 0); when the group is preempted, times out or is cancelled, or a worker fails,
   it deletes the pods that are left (and releases what the group still holds) and exits
   non-zero.

Exit codes: 0 done; 1 a worker failed; 3 preempted; 4 timed out or cancelled; 5 the job
ran past --deadline-s; 2 bad usage.

    python3 batch_job.py --gangway http://127.0.0.1:50051 --kubeconfig ~/.kube/config \\
        --namespace train --name job-1 --workers 4 --cpu 2
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from typing import Dict, List, Optional

from kubernetes import client as kube
from kubernetes import config as kube_config
from kubernetes.client.rest import ApiException

from gangway_client import Client, GangBuilder, GangGroupBuilder, GangwayError

#: How often the pods are read, in seconds.
POLL_S = 0.5
#: The annotation naming the gRPC group a pod belongs to (gangway's).
GROUP_ANNOTATION = "gangway.io/group"
#: The label this controller finds its pods by.
JOB_LABEL = "gangway.io/job"

DONE, WORKER_FAILED, USAGE, PREEMPTED, ENDED, OVERDUE = 0, 1, 2, 3, 4, 5


def log(message: str) -> None:
    print(f"batch_job: {message}", flush=True)


def worker_pod(args: argparse.Namespace, index: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{args.name}-{index}",
            "namespace": args.namespace,
            "labels": {JOB_LABEL: args.name},
            "annotations": {GROUP_ANNOTATION: args.name},
        },
        "spec": {
            "schedulerName": args.scheduler_name,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "worker",
                    "image": args.image,
                    "args": ["--rank", str(index), "--world-size", str(args.workers)],
                    "resources": {"requests": {"cpu": args.cpu}},
                }
            ],
        },
    }


def group_request(args: argparse.Namespace):
    return (
        GangGroupBuilder(args.name)
        .idempotency_key(f"batch-job-{args.namespace}-{args.name}")
        .gang(
            GangBuilder(args.namespace, args.name, args.workers)
            .priority(args.priority)
            .kubernetes_pods(args.name, args.workers, {"requests": {"cpu": args.cpu}})
        )
        .build()
    )


class Job:
    """One run: the pods, the group, and what is known of both."""

    def __init__(self, args: argparse.Namespace, core: kube.CoreV1Api, gangway: Client) -> None:
        self.args = args
        self.core = core
        self.gangway = gangway
        self.group_id: Optional[int] = None
        self.statuses: "queue.Queue[object]" = queue.Queue()

    def create_pods(self) -> None:
        for i in range(self.args.workers):
            try:
                self.core.create_namespaced_pod(self.args.namespace, worker_pod(self.args, i))
            except ApiException as e:
                if e.status != 409:  # Already there: a controller restarted mid-run.
                    raise
        log(f"created {self.args.workers} worker pods")

    def pods(self) -> List[kube.V1Pod]:
        return self.core.list_namespaced_pod(
            self.args.namespace, label_selector=f"{JOB_LABEL}={self.args.name}"
        ).items

    def all_succeeded(self, phases: Optional[Dict[str, str]] = None) -> bool:
        if phases is None:
            phases = {p.metadata.name: p.status.phase or "" for p in self.pods()}
        return len(phases) == self.args.workers and all(p == "Succeeded" for p in phases.values())

    def follow_group(self) -> None:
        """Runs in a thread: every status of the group into `statuses`, then None."""
        try:
            for status in self.gangway.watch(self.group_id):
                self.statuses.put(status)
        except GangwayError as e:
            self.statuses.put(e)
        self.statuses.put(None)

    def delete_pods(self) -> None:
        for pod in self.pods():
            try:
                self.core.delete_namespaced_pod(pod.metadata.name, self.args.namespace)
            except ApiException as e:
                if e.status != 404:
                    raise
        log("deleted the worker pods")

    def release(self) -> None:
        try:
            self.gangway.release(self.group_id)
        except GangwayError as e:
            # Already ended (preempted, released): nothing is held.
            log(f"release: {e.message}")

    def run(self) -> int:
        self.create_pods()
        submitted = self.gangway.submit(group_request(self.args))
        self.group_id = submitted.id
        log(f"submitted gang group {submitted.id} ({submitted.state})")
        threading.Thread(target=self.follow_group, daemon=True).start()
        deadline = time.monotonic() + self.args.deadline_s
        state, reason, bound_said = submitted.state, "", False
        while True:
            while True:
                try:
                    item = self.statuses.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, GangwayError):
                    log(f"watching the group failed: {item}")
                    continue
                if item is None:
                    continue
                if (item.state, item.reason) != (state, reason):
                    log(f"group {item.state}" + (f": {item.reason}" if item.reason else ""))
                state, reason = item.state, item.reason
                if item.state == "Preempted":
                    who = item.preempted.by if item.HasField("preempted") else "?"
                    log(f"preempted by gang group {who}; {len(item.preempted.members)} members evicted")
                    self.delete_pods()
                    return PREEMPTED
                if item.state in ("TimedOut", "Cancelled", "Released"):
                    # gangway gives back a member's room as its pod finishes: a group
                    # released with every worker succeeded is a job done.
                    if item.state == "Released" and self.all_succeeded():
                        log("every worker succeeded")
                        self.delete_pods()
                        return DONE
                    self.delete_pods()
                    return ENDED
            pods = self.pods()
            phases: Dict[str, str] = {p.metadata.name: p.status.phase or "" for p in pods}
            if not bound_said and len(pods) == self.args.workers and all(p.spec.node_name for p in pods):
                bound_said = True
                log("every worker bound: " + ", ".join(f"{p.metadata.name}={p.spec.node_name}" for p in pods))
            if any(phase == "Failed" for phase in phases.values()):
                log(f"a worker failed: {phases}")
                self.release()
                self.delete_pods()
                return WORKER_FAILED
            if self.all_succeeded(phases):
                log("every worker succeeded")
                self.release()
                self.delete_pods()
                return DONE
            if time.monotonic() > deadline:
                log(f"past the deadline of {self.args.deadline_s} s")
                self.release()
                self.delete_pods()
                return OVERDUE
            time.sleep(POLL_S)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gangway", required=True, help="gangway replicas, comma-separated (http://host:port)")
    parser.add_argument("--token-file", help="a bearer token for gangway")
    parser.add_argument("--kubeconfig", help="default: in-cluster, else ~/.kube/config")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--name", required=True, help="the job's (and its group's) name")
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--cpu", default="1", help="each worker's cpu request")
    parser.add_argument("--image", default="busybox")
    parser.add_argument("--priority", type=int, default=0)
    parser.add_argument("--scheduler-name", default="gangway")
    parser.add_argument("--deadline-s", type=float, default=3600.0, help="give up after this long")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers: at least 1")
    if args.kubeconfig:
        kube_config.load_kube_config(config_file=args.kubeconfig)
    else:
        try:
            kube_config.load_incluster_config()
        except kube_config.ConfigException:
            kube_config.load_kube_config()
    endpoints = [e for e in args.gangway.split(",") if e]
    with Client(endpoints, token_file=args.token_file) as gangway:
        return Job(args, kube.CoreV1Api(), gangway).run()


if __name__ == "__main__":
    sys.exit(main())
