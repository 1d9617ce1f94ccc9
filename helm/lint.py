#!/usr/bin/env python3
"""Lints and renders the gangway Helm chart with Helm's own code (helm-sdkpy).

Run from the repository root:  python3 helm/lint.py   (helm/lint.sh installs what it needs)

For the default values and for every helm/gangway/ci/*-values.yaml file it runs `helm lint`
and renders the chart, then checks the rendered objects: the StatefulSet, its start script
(run with sh for every pod ordinal), Services, RBAC rules, the config file and the TLS and
token mounts. It also renders a few values the chart must refuse (an even replicaCount among
them) and checks the message. One line per case; exits 1 if any case fails, a lint warning
or error included.

helm-sdkpy's Lint takes no values, so a values file is linted on a scratch copy of the chart
whose values.yaml is the chart's merged with the file (Helm's coalescing rules). Rendering
goes through helm-sdkpy's Install (it has no template or dry-run action) against a small
API-server stand-in on 127.0.0.1 that answers discovery and accepts the objects; the values
are passed as a dict, as `helm install -f FILE` would merge them.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

try:
    import helm_sdkpy
    import yaml
except ImportError as missing:
    sys.exit(f"helm/lint.py: {missing}; run helm/lint.sh, which installs helm-sdkpy and PyYAML")

try:
    import tomllib
except ImportError:  # Python < 3.11: the config file is then not parsed
    tomllib = None

HELM_DIR = Path(__file__).resolve().parent
CHART = HELM_DIR / "gangway"
REPO = HELM_DIR.parent
METRICS_DOC = REPO / "docs" / "METRICS.md"

RELEASE = "gangway"
NAMESPACE = "gangway-system"
LINT_WARNING = 2  # Helm's support.WarningSev; ErrorSev is 3
SEVERITY = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}

# Keys `gangway serve --config` accepts (server/src/config.rs, FileConfig: kebab-case).
CONFIG_KEYS = {
    "id", "listen", "advertise", "http", "peers", "data", "shards", "cluster-id", "join",
    "topology-label", "sled-cache-mb", "wire-format", "auto-rebalance", "rebalance-bound-percent",
    "rebalance-check-ms", "heartbeat-ms", "election-min-ms", "election-max-ms",
    "snapshot-every", "balance-interval-ms", "kubeconfig", "in-cluster", "scheduler-name",
    "bind-qps", "bind-concurrency", "tls-cert", "tls-key", "tls-client-ca", "auth-tokens-file",
    "peer-secret-file",
}

# (API group, resource, verb) the Kubernetes adapter uses; the ClusterRole must grant exactly these.
RBAC = set()
for _group, _resources, _verbs in [
    ("", ["pods"], ["get", "list", "watch", "patch", "delete"]),
    ("", ["pods/binding"], ["create"]),
    ("", ["pods/status"], ["patch"]),
    ("", ["events"], ["create", "patch"]),
    ("", ["nodes"], ["get", "list", "watch"]),
    ("policy", ["poddisruptionbudgets"], ["get", "list", "watch"]),
    ("scheduling.x-k8s.io", ["podgroups"], ["get", "list", "watch"]),
    ("scheduling.sigs.k8s.io", ["podgroups"], ["get", "list", "watch"]),
    ("scheduling.x-k8s.io", ["elasticquotas"], ["get", "list", "watch"]),
    ("scheduling.x-k8s.io", ["podgroups/status"], ["get", "patch", "update"]),
    ("scheduling.sigs.k8s.io", ["podgroups/status"], ["get", "patch", "update"]),
    ("resource.k8s.io", ["resourceslices", "deviceclasses", "resourceclaims", "devicetaintrules"], ["get", "list", "watch"]),
    ("resource.k8s.io", ["resourceclaims"], ["patch"]),
    ("resource.k8s.io", ["resourceclaims/status"], ["get", "update", "patch"]),
    ("resource.k8s.io", ["resourceclaims/binding"], ["update"]),
]:
    RBAC |= {(_group, r, v) for r in _resources for v in _verbs}


class Failed(Exception):
    """A check that did not hold."""


def check(cond: bool, what: str) -> None:
    if not cond:
        raise Failed(what)


# --- values -------------------------------------------------------------------------------


def coalesce(base, override):
    """Helm's merge of user values over chart values: maps merge, null deletes a key."""
    if not isinstance(base, dict) or not isinstance(override, dict):
        return copy.deepcopy(override)
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = coalesce(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def chart_values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text()) or {}


# Maps passed to Kubernetes as they are; the README documents them whole.
FREE_FORM = {"nodeSelector", "resources", "podSecurityContext", "securityContext", "dashboards.labels",
             "startupProbe", "livenessProbe", "readinessProbe"}


def leaf_paths(values, prefix=""):
    """Dotted paths of the values a user sets: scalars, lists, empty and free-form maps."""
    if isinstance(values, dict) and values and prefix not in FREE_FORM:
        for key, value in values.items():
            yield from leaf_paths(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix


# --- an API server stand-in for rendering ---------------------------------------------------

DISCOVERY = {
    "v1": [
        ("configmaps", "ConfigMap", True),
        ("secrets", "Secret", True),
        ("services", "Service", True),
        ("serviceaccounts", "ServiceAccount", True),
        ("namespaces", "Namespace", False),
    ],
    "apps/v1": [("statefulsets", "StatefulSet", True)],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    "rbac.authorization.k8s.io/v1": [
        ("clusterroles", "ClusterRole", False),
        ("clusterrolebindings", "ClusterRoleBinding", False),
    ],
    "apiextensions.k8s.io/v1": [("customresourcedefinitions", "CustomResourceDefinition", False)],
    "monitoring.coreos.com/v1": [("servicemonitors", "ServiceMonitor", True)],
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


class FakeApiServer:
    """Answers discovery, serves preset objects, accepts creates and updates. Loopback only."""

    def __init__(self):
        self.objects: dict[str, dict] = {}  # request path -> object
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def body(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Type", "").startswith("application/json"):
                    return json.loads(raw or b"{}")
                # Helm's release record arrives as protobuf; it is not needed here.
                return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "release"}}

            def do_GET(self):
                path = self.path.split("?")[0].rstrip("/")
                if path == "/version":
                    return self.reply(200, {"major": "1", "minor": "34", "gitVersion": "v1.34.0",
                                            "platform": "linux/amd64"})
                if path == "/api":
                    return self.reply(200, {"kind": "APIVersions", "versions": ["v1"],
                                            "serverAddressByClientCIDRs": []})
                if path == "/apis":
                    groups = []
                    for gv in DISCOVERY:
                        if "/" in gv:
                            group, version = gv.split("/")
                            v = {"groupVersion": gv, "version": version}
                            groups.append({"name": group, "versions": [v], "preferredVersion": v})
                    return self.reply(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
                gv = path[len("/api/"):] if path.startswith("/api/") else path[len("/apis/"):]
                if gv in DISCOVERY:
                    resources = [{"name": n, "singularName": k.lower(), "namespaced": ns, "kind": k,
                                  "verbs": VERBS} for n, k, ns in DISCOVERY[gv]]
                    return self.reply(200, {"kind": "APIResourceList", "apiVersion": "v1",
                                            "groupVersion": gv, "resources": resources})
                if path in server.objects:
                    return self.reply(200, server.objects[path])
                if path.endswith("/secrets"):  # Helm's release history: none
                    return self.reply(200, {"kind": "SecretList", "apiVersion": "v1",
                                            "metadata": {}, "items": []})
                return self.reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                        "reason": "NotFound", "code": 404, "message": f"{path} not found"})

            def do_POST(self):
                self.reply(201, self.body())

            def do_PUT(self):
                self.reply(200, self.body())

            def do_PATCH(self):
                self.body()
                path = self.path.split("?")[0].rstrip("/")
                self.reply(200, server.objects.get(path, {}))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        port = self.httpd.server_address[1]
        self.kubeconfig = f"""apiVersion: v1
kind: Config
clusters:
- name: stand-in
  cluster:
    server: http://127.0.0.1:{port}
contexts:
- name: stand-in
  context:
    cluster: stand-in
    user: stand-in
    namespace: {NAMESPACE}
current-context: stand-in
users:
- name: stand-in
  user:
    token: stand-in
"""

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def render(api: FakeApiServer, values: dict | None, preset: dict | None = None) -> str:
    """The chart's manifest for `values`; raises helm_sdkpy.HelmError with Helm's message."""
    api.objects = dict(preset or {})
    config = helm_sdkpy.Configuration(namespace=NAMESPACE, kubeconfig=api.kubeconfig)
    release = asyncio.run(helm_sdkpy.Install(config).run(
        RELEASE, str(CHART), values=values or None, wait=False, timeout=60))
    return release["manifest"]


def lint(api: FakeApiServer, chart_dir: Path) -> list[tuple[int, str]]:
    """Helm lint messages as (severity, path); helm-sdkpy does not pass their text on.
    Lint contacts no cluster; the stand-in's kubeconfig keeps the user's out of it."""
    config = helm_sdkpy.Configuration(namespace=NAMESPACE, kubeconfig=api.kubeconfig)
    result = asyncio.run(helm_sdkpy.Lint(config).run(str(chart_dir)))
    return [(m.get("Severity", 0), m.get("Path", "")) for m in result.get("Messages") or []]


def lint_with(api: FakeApiServer, values_override: dict | None, scratch: Path) -> list[tuple[int, str]]:
    if not values_override:
        return lint(api, CHART)
    copy_dir = scratch / f"lint-{len(list(scratch.iterdir()))}" / CHART.name
    shutil.copytree(CHART, copy_dir)
    merged = coalesce(chart_values(), values_override)
    (copy_dir / "values.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
    return lint(api, copy_dir)


# --- checks on rendered objects -------------------------------------------------------------


def parse(manifest: str) -> dict[tuple[str, str], dict]:
    objs = {}
    for doc in yaml.safe_load_all(manifest):
        if doc:
            key = (doc["kind"], doc["metadata"]["name"])
            check(key not in objs, f"{key} rendered twice")
            objs[key] = doc
    return objs


def run_start_script(container: dict, ordinal: int, scratch: Path) -> list[str]:
    """Runs the container's start script with sh as pod <release>-<ordinal>; the gangway
    it executes is a stub that prints its arguments."""
    stub_dir = scratch / "bin"
    stub = stub_dir / "gangway"
    if not stub.exists():
        stub_dir.mkdir(parents=True, exist_ok=True)
        stub.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
        stub.chmod(0o755)
    env = {"PATH": f"{stub_dir}:/usr/bin:/bin", "HOSTNAME": f"{RELEASE}-{ordinal}",
           "POD_NAME": f"{RELEASE}-{ordinal}", "POD_NAMESPACE": NAMESPACE}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
    command = container["command"]
    check(command[:2] == ["/bin/sh", "-c"], "the container command is not /bin/sh -c SCRIPT")
    proc = subprocess.run(["sh", "-c", command[2], *command[3:], *container.get("args", [])],
                          env=env, capture_output=True, text=True, timeout=30)
    check(proc.returncode == 0, f"start script failed for ordinal {ordinal}: {proc.stderr.strip()}")
    return proc.stdout.splitlines()


def flag_values(argv: list[str], flag: str) -> list[str]:
    out = []
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif arg.startswith(flag + "="):
            out.append(arg.split("=", 1)[1])
    return out


def check_release(objs: dict, values: dict, scratch: Path) -> str:
    """Checks the rendered objects against the merged values; returns a short summary."""
    full = RELEASE  # release "gangway" of chart "gangway"
    peers_svc = f"{full}-peers"
    sts = objs.get(("StatefulSet", full))
    check(sts is not None, f"no StatefulSet {full}")
    replicas = values["replicaCount"]
    initial = values["cluster"].get("initialReplicas") or replicas
    spec = sts["spec"]
    check(spec["replicas"] == replicas, f"StatefulSet replicas {spec['replicas']} != {replicas}")
    check(spec["podManagementPolicy"] == "Parallel", "podManagementPolicy is not Parallel")
    check(spec["serviceName"] == peers_svc, f"serviceName {spec['serviceName']} != {peers_svc}")
    check(sts["metadata"]["annotations"]["gangway/initial-replicas"] == str(initial),
          "initial-replicas annotation")
    check([t["metadata"]["name"] for t in spec["volumeClaimTemplates"]] == ["data"],
          "volumeClaimTemplates")
    pod = spec["template"]["spec"]
    check(pod["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}, "nodeSelector")
    check(any(t.get("key") == "node-role.kubernetes.io/control-plane" for t in pod["tolerations"]),
          "no control-plane toleration")
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    check(anti[0]["topologyKey"] == "kubernetes.io/hostname", "anti-affinity topologyKey")
    check(anti[0]["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"],
          "anti-affinity selects other pods than the StatefulSet's")
    psc = pod["securityContext"]
    check(psc["runAsNonRoot"] is True and psc["runAsUser"] == 65532 and "fsGroup" in psc
          and psc["seccompProfile"]["type"] == "RuntimeDefault", "pod securityContext")
    (container,) = pod["containers"]
    sc = container["securityContext"]
    check(sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
          and sc["capabilities"]["drop"] == ["ALL"] and sc["runAsNonRoot"] is True,
          "container securityContext")
    check(container["readinessProbe"]["httpGet"]["path"] == "/readyz", "readiness probe path")
    check(container["livenessProbe"]["httpGet"]["path"] == "/healthz", "liveness probe path")
    check("requests" in container["resources"], "no resource requests")
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    check(mounts["data"]["mountPath"] == "/var/lib/gangway", "data mount")

    # The start script, as every pod ordinal: ids, advertised names, peers, join.
    def addr(i):
        return f"{full}-{i}.{peers_svc}.{NAMESPACE}.svc:{values['ports']['grpc']}"

    overrides = {int(k): int(v) for k, v in (values["cluster"].get("idOverrides") or {}).items()}

    def node_id(i):
        return overrides.get(i, i + 1)

    joiners = []
    for ordinal in range(replicas):
        argv = run_start_script(container, ordinal, scratch)
        check(argv[:3] == ["serve", "--config", "/etc/gangway/config/gangway.toml"],
              f"ordinal {ordinal}: gangway started as {argv[:3]}")
        check(flag_values(argv, "--id") == [str(node_id(ordinal))], f"ordinal {ordinal}: --id")
        check(flag_values(argv, "--advertise") == [addr(ordinal)], f"ordinal {ordinal}: --advertise")
        check(flag_values(argv, "--log-format") == [values["logFormat"]], "--log-format")
        peers = flag_values(argv, "--peer")
        if ordinal < initial and ordinal not in overrides:
            want = [f"{node_id(i)}={addr(i)}" for i in range(initial) if i != ordinal]
            check(peers == want, f"ordinal {ordinal}: peers {peers} != {want}")
            check("--join" not in argv, f"ordinal {ordinal} joins but bootstraps the cluster")
            check(flag_values(argv, "--initial-cluster-state") == ["new"],
                  f"ordinal {ordinal}: an initial member needs --initial-cluster-state new")
        else:
            check(peers == [] and "--join" in argv, f"ordinal {ordinal} should start with --join")
            check("--initial-cluster-state" not in argv,
                  f"ordinal {ordinal} joins, so it must not be told to create the cluster")
            joiners.append(ordinal)

    # TLS and tokens: flags, read-only mounts of the named Secrets, and nothing when off.
    tls, auth = values["tls"], values["auth"]
    if tls["enabled"]:
        check(flag_values(argv, "--tls-cert") == [f"/etc/gangway/tls/{tls['certKey']}"], "--tls-cert")
        check(flag_values(argv, "--tls-key") == [f"/etc/gangway/tls/{tls['keyKey']}"], "--tls-key")
        check(flag_values(argv, "--tls-client-ca") == [f"/etc/gangway/tls-ca/{tls['clientCA']['key']}"],
              "--tls-client-ca")
        check(mounts["tls"]["readOnly"] and mounts["tls-ca"]["readOnly"], "TLS mounts not read-only")
        check(volumes["tls"]["secret"]["secretName"] == tls["secretName"], "TLS Secret name")
        check(volumes["tls-ca"]["secret"]["secretName"] == (tls["clientCA"]["secretName"] or tls["secretName"]),
              "client CA Secret name")
    else:
        check(not any(a.startswith("--tls") for a in argv) and "tls" not in mounts, "TLS flags without tls.enabled")
    if auth["enabled"]:
        check(flag_values(argv, "--auth-tokens-file") == [f"/etc/gangway/auth/{auth['key']}"], "--auth-tokens-file")
        check(mounts["auth"]["readOnly"], "token mount not read-only")
        check(volumes["auth"]["secret"]["secretName"] == auth["secretName"], "token Secret name")
    else:
        check("--auth-tokens-file" not in " ".join(argv) and "auth" not in mounts, "token flag without auth.enabled")

    # The peer secret: always mounted read-only; a chart-made Secret unless one is named.
    peer = values["peerSecret"]
    check(flag_values(argv, "--peer-secret-file") == [f"/etc/gangway/peer/{peer['key']}"],
          "--peer-secret-file")
    check(mounts["peer"]["readOnly"], "peer secret mount not read-only")
    peer_secret = peer["secretName"] or f"{full}-peer"
    check(volumes["peer"]["secret"]["secretName"] == peer_secret, "peer Secret name")
    if not peer["secretName"]:
        made = objs.get(("Secret", peer_secret))
        check(made is not None and len(made["data"][peer["key"]]) >= 16, "no generated peer Secret")
    else:
        check(("Secret", f"{full}-peer") not in objs, "a peer Secret made although one is named")

    # Services: headless peers publishing not-ready pods, the front door, metrics.
    peers_spec = objs[("Service", peers_svc)]["spec"]
    check(peers_spec["clusterIP"] == "None" and peers_spec["publishNotReadyAddresses"] is True,
          "peers Service is not headless with publishNotReadyAddresses")
    check(objs[("Service", full)]["spec"]["ports"][0]["targetPort"] == "grpc", "front door port")
    check(objs[("Service", f"{full}-metrics")]["spec"]["ports"][0]["targetPort"] == "http", "metrics port")
    pdb = objs.get(("PodDisruptionBudget", full))
    check(pdb is not None and pdb["spec"]["maxUnavailable"] == 1, "PodDisruptionBudget maxUnavailable 1")

    # RBAC: exactly the verbs gangway uses, bound to the pods' ServiceAccount.
    role = objs[("ClusterRole", f"{NAMESPACE}-{full}")]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    check(granted == RBAC, f"ClusterRole grants {sorted(granted - RBAC)} too many, "
                           f"{sorted(RBAC - granted)} too few")
    binding = objs[("ClusterRoleBinding", f"{NAMESPACE}-{full}")]
    check(binding["subjects"][0]["name"] == pod["serviceAccountName"], "binding subject")
    check(("ServiceAccount", pod["serviceAccountName"]) in objs, "no ServiceAccount")

    # The config file: valid TOML with keys gangway knows.
    toml_text = objs[("ConfigMap", f"{full}-config")]["data"]["gangway.toml"]
    if tomllib is not None:
        config = tomllib.loads(toml_text)
        check(set(config) <= CONFIG_KEYS, f"unknown config keys {sorted(set(config) - CONFIG_KEYS)}")
        check(config["shards"] == values["cluster"]["shards"], "shards")
        check(config["wire-format"] in ("binary", "json"), "wire-format is binary or json")
        check(isinstance(config["auto-rebalance"], bool), "auto-rebalance is a boolean")
        check(101 <= config["rebalance-bound-percent"] <= 1000, "rebalance-bound-percent in 101..=1000")
        check(config["data"].startswith("/var/lib/gangway/"), "data dir outside the volume")

    summary = f"{len(objs)} objects, {replicas} replicas"
    if joiners:
        summary += ", joining: " + ", ".join(f"{full}-{o}" for o in joiners)
    if tls["enabled"]:
        summary += ", mTLS"
    if auth["enabled"]:
        summary += ", tokens"
    return summary


def check_optional(objs: dict) -> str:
    crd = objs[("CustomResourceDefinition", "podgroups.scheduling.x-k8s.io")]
    version = crd["spec"]["versions"][0]
    check(version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}, "CRD version")
    props = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    check({"minMember", "scheduleTimeoutSeconds"} <= set(props), "CRD spec fields")
    eq = objs[("CustomResourceDefinition", "elasticquotas.scheduling.x-k8s.io")]
    eq_version = eq["spec"]["versions"][0]
    check(eq_version["name"] == "v1alpha1", "ElasticQuota CRD version")
    eq_props = eq_version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    check({"min", "max"} <= set(eq_props), "ElasticQuota CRD spec fields")
    monitor = objs[("ServiceMonitor", RELEASE)]["spec"]
    metrics_svc = objs[("Service", f"{RELEASE}-metrics")]
    labels = metrics_svc["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in monitor["selector"]["matchLabels"].items()),
          "ServiceMonitor does not select the metrics Service")
    check(monitor["endpoints"][0]["port"] == metrics_svc["spec"]["ports"][0]["name"], "ServiceMonitor port")
    check(not any(obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "metrics"
                  for (kind, name), obj in objs.items()
                  if kind == "Service" and name != f"{RELEASE}-metrics"),
          "ServiceMonitor would select other Services")
    dash_cm = objs[("ConfigMap", f"{RELEASE}-dashboard")]
    check(dash_cm["metadata"]["labels"].get("grafana_dashboard") == "1", "dashboard label")
    dashboard = json.loads(dash_cm["data"]["gangway.json"])
    used = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            used |= set(re.findall(r"\bgangway_[a-z_]+", target["expr"]))
    documented = set(re.findall(r"`(gangway_[a-z_]+)`", METRICS_DOC.read_text()))

    def family(metric):  # a histogram's _bucket/_count/_sum series belong to its documented name
        stem = re.sub(r"_(bucket|count|sum)$", "", metric)
        return stem if stem in documented else metric

    base = {family(m) for m in used}
    check(base <= documented, f"dashboard uses undocumented metrics {sorted(base - documented)}")
    return f"CRD, ServiceMonitor, dashboard ({len(dashboard['panels'])} panels, {len(base)} of {len(documented)} metrics)"


# --- cases ----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--show", metavar="CASE",
                        help="print the rendered manifest of CASE (default, a ci file's stem, optional)")
    args = parser.parse_args()

    api = FakeApiServer()
    scratch = Path(tempfile.mkdtemp(prefix="gangway-helm-"))
    results: list[bool] = []
    shown = False

    def report(ok: bool, name: str, detail: str) -> None:
        results.append(ok)
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)

    def valid_case(case: str, name: str, override: dict | None, extra=None) -> None:
        nonlocal shown
        try:
            messages = lint_with(api, override, scratch)
            bad = [(s, p) for s, p in messages if s >= LINT_WARNING]
            infos = len(messages) - len(bad)
            problems = []
            if bad:
                problems.append("helm lint: " + ", ".join(f"{SEVERITY.get(s, s)} in {p}" for s, p in bad))
            try:
                manifest = render(api, override)
            except helm_sdkpy.HelmError as e:
                problems.append(f"render: {e}")
            check(not problems, "; ".join(problems))
            if args.show == case:
                print(manifest)
                shown = True
            objs = parse(manifest)
            values = coalesce(chart_values(), override or {})
            detail = check_release(objs, values, scratch)
            if extra:
                detail += "; " + extra(objs)
            report(True, name, f"lint clean ({infos} info), {detail}")
        except Failed as e:
            report(False, name, str(e))
        except Exception as e:  # a broken check is a failed case, not a crash
            report(False, name, f"{type(e).__name__}: {e}")

    def refused_case(name: str, override: dict, expect: str, preset: dict | None = None) -> None:
        try:
            render(api, override, preset)
        except helm_sdkpy.HelmError as e:
            message = str(e)
            if expect in message:
                report(True, name, "refused: " + message[message.index(expect):].splitlines()[0])
            else:
                report(False, name, f"refused, but not with {expect!r}: {message}")
            return
        report(False, name, "rendered; it must be refused")

    try:
        valid_case("default", "default values", None)
        for values_file in sorted((CHART / "ci").glob("*-values.yaml")):
            override = yaml.safe_load(values_file.read_text()) or {}
            case = values_file.name[: -len("-values.yaml")]
            valid_case(case, f"ci/{values_file.name}", override)
        valid_case("optional", "podGroupCRD, elasticQuotaCRD, serviceMonitor and dashboards enabled",
                   {"podGroupCRD": {"enabled": True}, "elasticQuotaCRD": {"enabled": True}, "metrics": {"serviceMonitor": {"enabled": True}},
                    "dashboards": {"enabled": True}}, check_optional)

        refused_case("replicaCount=4 refused", {"replicaCount": 4}, "replicaCount must be odd")
        refused_case("tls.enabled without tls.secretName refused", {"tls": {"enabled": True}},
                     "tls.enabled needs tls.secretName")

        # Scaling an installed 3-replica cluster to 5: the new pods must join, not bootstrap.
        live = {f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/{RELEASE}": {
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": RELEASE, "namespace": NAMESPACE,
                         "labels": {"app.kubernetes.io/managed-by": "Helm"},
                         "annotations": {"gangway/initial-replicas": "3",
                                         "meta.helm.sh/release-name": RELEASE,
                                         "meta.helm.sh/release-namespace": NAMESPACE}},
            "spec": {"replicas": 3}}}
        refused_case("scaling 3 -> 5 without cluster.initialReplicas refused", {"replicaCount": 5},
                     "this cluster was created with 3 members", preset=live)
        scale = {"replicaCount": 5, "cluster": {"initialReplicas": 3}}
        try:
            values = coalesce(chart_values(), scale)
            detail = check_release(parse(render(api, scale, preset=live)), values, scratch)
            report(True, "scaling 3 -> 5 with cluster.initialReplicas=3", detail)
        except (Failed, helm_sdkpy.HelmError) as e:
            report(False, "scaling 3 -> 5 with cluster.initialReplicas=3", str(e))

        # A replica that lost its disk comes back under a new node id, joining.
        replaced = {"cluster": {"idOverrides": {"1": 101}}}
        try:
            values = coalesce(chart_values(), replaced)
            detail = check_release(parse(render(api, replaced)), values, scratch)
            report(True, 'cluster.idOverrides {"1": 101}', detail + " (as node 101)")
        except (Failed, helm_sdkpy.HelmError) as e:
            report(False, 'cluster.idOverrides {"1": 101}', str(e))
        refused_case("reusing a node id refused", {"cluster": {"idOverrides": {"1": 3}}},
                     "node id 3 is already used")

        # Every value is documented in the chart README's table.
        readme = (CHART / "README.md").read_text()
        paths = list(leaf_paths(chart_values()))
        missing = [p for p in paths if f"`{p}`" not in readme]
        report(not missing, "values documented in helm/gangway/README.md",
               f"{len(paths)} values" if not missing else f"missing {', '.join(missing)}")
    finally:
        api.close()
        shutil.rmtree(scratch, ignore_errors=True)

    if args.show and not shown:
        print(f"no rendered case named {args.show!r}", file=sys.stderr)
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if all(results) and (shown or not args.show) else 1


if __name__ == "__main__":
    sys.exit(main())
