#!/usr/bin/env python3
"""Lints and renders the gangway Helm chart with Helm's own code (helm-sdkpy).

Run from the repository root:  python3 helm/lint.py   (helm/lint.sh installs what it needs)

For the default values, every helm/gangway/ci/*-values.yaml file and the authorization, TLS
and peer-port variants it runs `helm lint` and renders the chart, then checks the rendered
objects and NOTES: the StatefulSet, its start script (run with sh for every pod ordinal; peers
on the peer port, or on the client port when Raft shares it), Services, RBAC rules (gangway's
own and the users' ClusterRoles), the config file, the TLS, client-certificate, policy and
token flags and mounts, the cert-manager objects (the replicas' certificate with subject
O=gangway:peers) or the certificates Helm generates without cert-manager (decoded: CN
gangway:peers for the replicas, gangway-admin for the admin, one CA), the access policy (the
admin certificate's identity in auth.mode kubernetes) and the NetworkPolicy (the peer port for
the release's pods only). The default render must be secure as installed, with and without
cert-manager: mutual TLS, --kube-auth, --peer-listen, the NetworkPolicy. Generated
certificates must survive a second render against a cluster holding them (lookup). It also
renders values the chart must refuse (an even replicaCount, auth.mode kubernetes without
in-cluster credentials, policy mode without a policy, moving a running cluster's Raft port
under the same node ids, ...) and checks the message. One line per case; exits 1 if any case
fails, a lint warning or error included.

helm-sdkpy's Lint takes no values, so a values file is linted on a scratch copy of the chart
whose values.yaml is the chart's merged with the file (Helm's coalescing rules). Rendering
goes through helm-sdkpy's Install (it has no template or dry-run action) against a small
API-server stand-in on 127.0.0.1 that answers discovery and accepts the objects; the values
are passed as a dict, as `helm install -f FILE` would merge them. Two stand-ins run: one
serving cert-manager's API (where tls.certManager=auto uses it) and one without.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import re
import shutil
import os
import subprocess
import sys
import tempfile
import textwrap
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
    "topology-label", "topology-levels", "sled-cache-mb", "wire-format", "auto-rebalance", "rebalance-bound-percent",
    "rebalance-check-ms", "fair-share-half-life-ms", "head-reservations", "heartbeat-ms", "election-min-ms", "election-max-ms",
    "snapshot-every", "balance-interval-ms", "kubeconfig", "in-cluster", "scheduler-name",
    "bind-qps", "bind-concurrency", "tls-cert", "tls-key", "tls-client-ca", "auth-tokens-file",
    "peer-secret-file", "scheduler-config",
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
    ("scheduling.k8s.io", ["podgroups"], ["get", "list", "watch"]),
    ("scheduling.volcano.sh", ["podgroups"], ["get", "list", "watch"]),
    ("scheduling.x-k8s.io", ["elasticquotas"], ["get", "list", "watch"]),
    ("kueue.x-k8s.io", ["topologies"], ["get", "list", "watch"]),
    ("scheduling.x-k8s.io", ["podgroups/status"], ["get", "patch", "update"]),
    ("scheduling.sigs.k8s.io", ["podgroups/status"], ["get", "patch", "update"]),
    ("scheduling.k8s.io", ["podgroups/status"], ["get", "patch", "update"]),
    ("scheduling.volcano.sh", ["podgroups/status"], ["get", "patch", "update"]),
    ("resource.k8s.io", ["resourceslices", "deviceclasses", "resourceclaims", "devicetaintrules"], ["get", "list", "watch"]),
    ("resource.k8s.io", ["resourceclaims"], ["patch"]),
    ("resource.k8s.io", ["resourceclaims/status"], ["get", "update", "patch"]),
    ("resource.k8s.io", ["resourceclaims/binding"], ["update"]),
]:
    RBAC |= {(_group, r, v) for r in _resources for v in _verbs}


# Added with auth.mode kubernetes: TokenReview and SubjectAccessReview of clients.
KUBE_REVIEW = {("authentication.k8s.io", "tokenreviews", "create"),
               ("authorization.k8s.io", "subjectaccessreviews", "create")}

# The ClusterRoles the chart ships for gangway's users: (resource, verb) in API group
# gangway.dev, without resourceNames. They must grant exactly these.
GANGWAY_RESOURCES = ["ganggroups", "queues", "priorities", "nodes", "cluster"]
GANGWAY_VERBS = ["get", "list", "watch", "create", "update", "delete", "use", "preempt"]
READ_VERBS = ["get", "list", "watch"]
USER_ROLES = {
    "admin": {(r, v) for r in GANGWAY_RESOURCES + ["cluster/statehash"] for v in GANGWAY_VERBS},
    "viewer": {(r, v) for r in GANGWAY_RESOURCES for v in READ_VERBS},
    "tenant": {("ganggroups", v) for v in ["get", "list", "watch", "create", "update", "delete"]}
              | {("queues", "get"), ("queues", "list")},
    "node": {("nodes", "get"), ("nodes", "update")},
}
PEER_ORGANIZATION = "gangway:peers"
POLICY_FILE = "/etc/gangway/policy/policy.yaml"
# The identity the chart's policy gives the admin client certificate (auth.adminCertificate).
ADMIN_IDENTITY = {"name": "gangway-admin", "roles": ["admin"], "certificates": ["gangway-admin"]}
KEEP = {"helm.sh/resource-policy": "keep"}


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
    "networking.k8s.io/v1": [("networkpolicies", "NetworkPolicy", True)],
}
# A cluster with cert-manager serves this group as well (tls.certManager=auto then uses it).
CERT_MANAGER = {
    "cert-manager.io/v1": [
        ("issuers", "Issuer", True),
        ("clusterissuers", "ClusterIssuer", False),
        ("certificates", "Certificate", True),
    ],
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


class FakeApiServer:
    """Answers discovery, serves preset objects, accepts creates and updates. Loopback only.
    `extra` adds API groups to discovery (e.g. CERT_MANAGER). Each instance has its own
    port, so client-side discovery caches never mix two of them."""

    def __init__(self, extra: dict | None = None):
        self.objects: dict[str, dict] = {}  # request path -> object
        discovery = {**DISCOVERY, **(extra or {})}
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
                    for gv in discovery:
                        if "/" in gv:
                            group, version = gv.split("/")
                            v = {"groupVersion": gv, "version": version}
                            groups.append({"name": group, "versions": [v], "preferredVersion": v})
                    return self.reply(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
                gv = path[len("/api/"):] if path.startswith("/api/") else path[len("/apis/"):]
                if gv in discovery:
                    resources = [{"name": n, "singularName": k.lower(), "namespaced": ns, "kind": k,
                                  "verbs": VERBS} for n, k, ns in discovery[gv]]
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


def render_release(api: FakeApiServer, values: dict | None, preset: dict | None = None) -> dict:
    """The chart's release for `values` (manifest, info.notes); raises helm_sdkpy.HelmError
    with Helm's message."""
    api.objects = dict(preset or {})
    config = helm_sdkpy.Configuration(namespace=NAMESPACE, kubeconfig=api.kubeconfig)
    return asyncio.run(helm_sdkpy.Install(config).run(
        RELEASE, str(CHART), values=values or None, wait=False, timeout=60))


def render(api: FakeApiServer, values: dict | None, preset: dict | None = None) -> str:
    """The chart's manifest for `values`; raises helm_sdkpy.HelmError with Helm's message."""
    return render_release(api, values, preset)["manifest"]


def lint(api: FakeApiServer, chart_dir: Path) -> list[tuple[int, str]]:
    """Helm lint messages as (severity, path); helm-sdkpy does not pass their text on.
    Lint contacts no cluster; the stand-in's kubeconfig keeps the user's out of it. Lint mode
    only logs a template's `fail` to stderr; such a line is held back here and returned as an
    error (every linted case must render: without cert-manager Helm generates the
    certificates)."""
    config = helm_sdkpy.Configuration(namespace=NAMESPACE, kubeconfig=api.kubeconfig)
    sys.stderr.flush()
    saved = os.dup(2)
    failed = []
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            result = asyncio.run(helm_sdkpy.Lint(config).run(str(chart_dir)))
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        for line in held.read().decode(errors="replace").splitlines():
            if "funcMap fail" in line:
                failed.append((3, "template fail: " + line.strip()))
            else:
                print(line, file=sys.stderr)
    return [(m.get("Severity", 0), m.get("Path", "")) for m in result.get("Messages") or []] + failed


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


# --- what the values resolve to (as the chart's helpers do) ----------------------------------


def peer_shared(values: dict) -> bool:
    """Raft shares the client port: ports.peer null (deleted) or equal to ports.grpc."""
    peer = values["ports"].get("peer")
    return peer is None or peer == values["ports"]["grpc"]


def peer_port(values: dict) -> int:
    return values["ports"]["grpc"] if peer_shared(values) else values["ports"]["peer"]


def tls_source(values: dict, cert_manager: bool) -> str:
    """off, secret, cert-manager or generated (gangway.tlsSource), for a cluster with or
    without cert-manager's API."""
    tls = values["tls"]
    if not tls["enabled"]:
        return "off"
    if tls["secretName"]:
        return "secret"
    cm = str(tls["certManager"]).lower()
    if cm == "true" or (cm == "auto" and cert_manager):
        return "cert-manager"
    return "generated"


def client_certs(values: dict) -> str:
    """--tls-client-certs: auto is optional in auth.mode kubernetes, required otherwise."""
    v = values["tls"]["clientCerts"]
    if v == "auto":
        return "optional" if values["auth"]["mode"] == "kubernetes" else "required"
    return v


def admin_in_policy(values: dict, source: str) -> bool:
    """Whether the chart's policy names the admin client certificate an administrator."""
    auth = values["auth"]
    return (auth["mode"] == "kubernetes" and bool(auth.get("adminCertificate")) and source != "off"
            and not auth["policy"]["secretName"])


def with_policy(values: dict, source: str) -> bool:
    mode, policy = values["auth"]["mode"], values["auth"]["policy"]
    return mode == "policy" or (mode == "kubernetes" and bool(
        policy["secretName"] or policy["inline"] or admin_in_policy(values, source)))


def expected_policy(values: dict, source: str):
    """The policy the chart's Secret must hold (parsed): auth.policy.inline, followed by the
    admin certificate's identity unless the inline policy names certificate gangway-admin."""
    inline = values["auth"]["policy"]["inline"]
    parsed = (yaml.safe_load(inline) if isinstance(inline, str) else inline) or {}
    if not admin_in_policy(values, source):
        return parsed
    ids = list(parsed.get("identities") or [])
    if not any("gangway-admin" in (i.get("certificates") or []) for i in ids):
        ids.append(ADMIN_IDENTITY)
    return {"identities": ids}


# --- certificates ---------------------------------------------------------------------------

try:
    from cryptography import x509 as _x509
    from cryptography.hazmat.primitives.asymmetric import padding as _padding
except ImportError:
    _x509 = None
CERT_DECODER = "cryptography" if _x509 else None
_SKIPPED_NOTE_SHOWN = False


def _decoder() -> str | None:
    """cryptography if installed, else the standard library's ssl decoder, else openssl."""
    global CERT_DECODER
    if CERT_DECODER is None:
        import ssl
        if hasattr(getattr(ssl, "_ssl", None), "_test_decode_cert"):
            CERT_DECODER = "ssl"
        elif shutil.which("openssl"):
            CERT_DECODER = "openssl"
        else:
            CERT_DECODER = "none"
    return None if CERT_DECODER == "none" else CERT_DECODER


def decode_cert(pem: bytes, scratch: Path) -> dict | None:
    """Subject and issuer CNs and Os, DNS and IP names of a PEM certificate; None when nothing
    can decode it (the caller then skips with a note)."""
    how = _decoder()
    if how == "cryptography":
        cert = _x509.load_pem_x509_certificate(pem)

        def names(name, oid):
            return [a.value for a in name.get_attributes_for_oid(oid)]
        try:
            san = cert.extensions.get_extension_for_class(_x509.SubjectAlternativeName).value
            dns, ips = san.get_values_for_type(_x509.DNSName), [str(i) for i in san.get_values_for_type(_x509.IPAddress)]
        except _x509.ExtensionNotFound:
            dns, ips = [], []
        try:
            ca = cert.extensions.get_extension_for_class(_x509.BasicConstraints).value.ca
        except _x509.ExtensionNotFound:
            ca = False
        return {"cn": names(cert.subject, _x509.NameOID.COMMON_NAME),
                "o": names(cert.subject, _x509.NameOID.ORGANIZATION_NAME),
                "issuer_cn": names(cert.issuer, _x509.NameOID.COMMON_NAME),
                "dns": dns, "ip": ips, "ca": ca, "cert": cert,
                "days": (cert.not_valid_after_utc - cert.not_valid_before_utc).days}
    path = scratch / "cert.pem"
    path.write_bytes(pem)
    if how == "ssl":
        import ssl
        d = ssl._ssl._test_decode_cert(str(path))

        def rdn(seq, key):
            return [v for part in seq for k, v in part if k == key]
        san = d.get("subjectAltName", ())
        return {"cn": rdn(d["subject"], "commonName"), "o": rdn(d["subject"], "organizationName"),
                "issuer_cn": rdn(d["issuer"], "commonName"),
                "dns": [v for k, v in san if k == "DNS"], "ip": [v for k, v in san if k == "IP Address"]}
    if how == "openssl":
        out = subprocess.run(["openssl", "x509", "-in", str(path), "-noout", "-subject", "-issuer",
                              "-nameopt", "multiline", "-ext", "subjectAltName"],
                             capture_output=True, text=True, check=True).stdout
        subject, _, rest = out.partition("issuer=")
        issuer, _, san = rest.partition("X509v3 Subject Alternative Name")
        field = lambda text, key: re.findall(rf"^\s*{key}\s*=\s*(.+?)\s*$", text, re.M)
        return {"cn": field(subject, "commonName"), "o": field(subject, "organizationName"),
                "issuer_cn": field(issuer, "commonName"),
                "dns": re.findall(r"DNS:([^,\s]+)", san), "ip": re.findall(r"IP Address:([^,\s]+)", san)}
    return None


def check_generated(objs: dict, values: dict, peer_hosts: list[str], scratch: Path) -> str:
    """The certificates Helm generates without cert-manager: Secrets <full>-tls and
    <full>-admin-client (tls.crt, tls.key, ca.crt; kept on uninstall), one CA; decoded, the
    replicas' certificate has CN gangway:peers and covers every replica and the front door, the
    admin's has CN gangway-admin and is no peer certificate."""
    global _SKIPPED_NOTE_SHOWN
    import base64
    full = RELEASE
    check(not any(k in ("Certificate", "Issuer") for k, _ in objs), "cert-manager objects without cert-manager")
    data = {}
    for name in (f"{full}-tls", f"{full}-admin-client"):
        secret = objs.get(("Secret", name))
        check(secret is not None, f"no generated Secret {name}")
        check(secret["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep",
              f"Secret {name}: not annotated helm.sh/resource-policy: keep")
        check(secret["metadata"].get("namespace") == NAMESPACE, f"Secret {name}: namespace")
        check(set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}, f"Secret {name}: keys {sorted(secret['data'])}")
        data[name] = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    tls, admin = data[f"{full}-tls"], data[f"{full}-admin-client"]
    check(tls["ca.crt"] == admin["ca.crt"], "the replicas' and the admin certificate name different CAs")
    for name, d in data.items():
        check(d["tls.crt"].startswith(b"-----BEGIN CERTIFICATE-----") and b"PRIVATE KEY-----" in d["tls.key"],
              f"Secret {name}: not PEM")
    peer = decode_cert(tls["tls.crt"], scratch)
    if peer is None:
        if not _SKIPPED_NOTE_SHOWN:
            print("note: neither cryptography, Python's ssl decoder nor openssl is available: "
                  "the generated certificates' subjects are not checked", flush=True)
            _SKIPPED_NOTE_SHOWN = True
        return "generated certificates (not decoded)"
    adm = decode_cert(admin["tls.crt"], scratch)
    ca = decode_cert(tls["ca.crt"], scratch)
    check(peer["cn"] == [PEER_ORGANIZATION], f"replicas' certificate CN {peer['cn']} != [{PEER_ORGANIZATION}]")
    check(adm["cn"] == ["gangway-admin"], f"admin certificate CN {adm['cn']} != ['gangway-admin']")
    check(PEER_ORGANIZATION not in adm["cn"] + adm["o"], "the admin client certificate is a peer certificate")
    check(PEER_ORGANIZATION not in ca["cn"] + ca["o"], "the CA is a peer certificate")
    check(peer["issuer_cn"] == ca["cn"] and adm["issuer_cn"] == ca["cn"], "the certificates' issuer is not the CA")
    for h in peer_hosts:
        check(any(dns_matches(n, h) for n in peer["dns"]), f"replicas' certificate does not cover {h}")
    want = set(want_dns_names(values))
    check(set(peer["dns"]) == want, f"replicas' certificate DNS names {sorted(peer['dns'])} != {sorted(want)}")
    check(peer["ip"] == ["127.0.0.1"], f"replicas' certificate IP addresses {peer['ip']}")
    if CERT_DECODER == "cryptography":
        # Signed by the CA, a CA only the CA, the private keys those of the certificates,
        # and the lifetime tls.generatedDays.
        from cryptography.hazmat.primitives.serialization import load_pem_private_key
        check(ca["ca"] and not peer["ca"] and not adm["ca"], "basic constraints: only the CA is a CA")
        for leaf in (peer, adm):
            cert = leaf["cert"]
            ca["cert"].public_key().verify(cert.signature, cert.tbs_certificate_bytes,
                                           _padding.PKCS1v15(), cert.signature_hash_algorithm)
            check(leaf["days"] == values["tls"]["generatedDays"], f"certificate lifetime {leaf['days']} days")
        for d, leaf in ((tls, peer), (admin, adm)):
            key = load_pem_private_key(d["tls.key"], None)
            check(key.public_key().public_numbers() == leaf["cert"].public_key().public_numbers(),
                  "a generated key does not belong to its certificate")
    return f"generated certificates (decoded with {CERT_DECODER}: CN {PEER_ORGANIZATION}, CN gangway-admin, one CA)"


def want_dns_names(values: dict) -> list[str]:
    """The replicas' certificate DNS names: every replica's peer name, the front door,
    localhost, tls.extraDnsNames."""
    full = RELEASE
    domain = (values["cluster"].get("clusterDomain") or "").lstrip(".")
    want = [f"*.{full}-peers.{NAMESPACE}.svc", full, f"{full}.{NAMESPACE}", f"{full}.{NAMESPACE}.svc", "localhost"]
    if domain:
        want += [f"*.{full}-peers.{NAMESPACE}.svc.{domain}", f"{full}.{NAMESPACE}.svc.{domain}"]
    return want + list(values["tls"]["extraDnsNames"] or [])


def check_release(objs: dict, values: dict, scratch: Path, cert_manager: bool = True) -> str:
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
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    shared = peer_shared(values)
    source = tls_source(values, cert_manager)
    check(ports == {n: values["ports"][n] for n in (("grpc", "http") if shared else ("grpc", "peer", "http"))},
          f"container ports {ports}")

    # The start script, as every pod ordinal: ids, advertised names (on the peer port, or
    # the client port when Raft shares it), peers, join.
    domain = (values["cluster"].get("clusterDomain") or "").lstrip(".")
    suffix = f"svc.{domain}" if domain else "svc"

    def host(i):
        return f"{full}-{i}.{peers_svc}.{NAMESPACE}.{suffix}"

    def addr(i):
        return f"{host(i)}:{peer_port(values)}"

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

    # The peer port: its own listener; the client port stays --listen (config file). When
    # Raft shares the client port, no --peer-listen.
    bind = values["bindAddress"]
    bind = f"[{bind}]" if ":" in bind and not bind.startswith("[") else bind
    want_listen = [] if shared else [f"{bind}:{values['ports']['peer']}"]
    check(flag_values(argv, "--peer-listen") == want_listen, f"--peer-listen {flag_values(argv, '--peer-listen')}")

    # TLS: flags and read-only mounts of the certificate's Secret (the user's, the one
    # cert-manager fills, or the one Helm generates), and nothing when off.
    tls, auth = values["tls"], values["auth"]
    tls_detail = ""
    if tls["enabled"]:
        user_secret = tls["secretName"]
        cert_key = tls["certKey"] if user_secret else "tls.crt"
        key_key = tls["keyKey"] if user_secret else "tls.key"
        ca_key = tls["clientCA"]["key"] if (user_secret or tls["clientCA"]["secretName"]) else "ca.crt"
        secret = user_secret or f"{full}-tls"
        check(flag_values(argv, "--tls-cert") == [f"/etc/gangway/tls/{cert_key}"], "--tls-cert")
        check(flag_values(argv, "--tls-key") == [f"/etc/gangway/tls/{key_key}"], "--tls-key")
        check(flag_values(argv, "--tls-client-ca") == [f"/etc/gangway/tls-ca/{ca_key}"], "--tls-client-ca")
        check(mounts["tls"]["readOnly"] and mounts["tls-ca"]["readOnly"], "TLS mounts not read-only")
        check(volumes["tls"]["secret"]["secretName"] == secret, "TLS Secret name")
        check(volumes["tls-ca"]["secret"]["secretName"] == (tls["clientCA"]["secretName"] or secret),
              "client CA Secret name")
        check({i["key"] for i in volumes["tls"]["secret"]["items"]} == {cert_key, key_key}, "TLS Secret keys")
        # Clients without a certificate (with a bearer token): --tls-client-certs optional.
        want_cc = ["optional"] if client_certs(values) == "optional" else []
        check(flag_values(argv, "--tls-client-certs") == want_cc,
              f"--tls-client-certs {flag_values(argv, '--tls-client-certs')} != {want_cc}")
        generated = [n for n in (f"{full}-tls", f"{full}-admin-client") if ("Secret", n) in objs]
        if source == "secret":
            check(not any(k == "Certificate" for k, _ in objs), "Certificates made although tls.secretName is set")
            check(not generated, "certificates generated although tls.secretName is set")
        elif source == "cert-manager":
            check_certificates(objs, values, [host(i) for i in range(replicas)])
            check(not generated, "certificates generated although cert-manager makes them")
        else:
            tls_detail = check_generated(objs, values, [host(i) for i in range(replicas)], scratch)
    else:
        check(not any(a.startswith("--tls") for a in argv) and "tls" not in mounts, "TLS flags without tls.enabled")
        check(not any(k in ("Certificate", "Issuer") for k, _ in objs), "cert-manager objects without tls.enabled")
        check(("Secret", f"{full}-tls") not in objs, "certificates generated without tls.enabled")

    # Authorization: --kube-auth, --policy-file, or neither (auth.mode none).
    mode = auth["mode"]
    policy = auth["policy"]
    policy_on = with_policy(values, source)
    check(("--kube-auth" in argv) == (mode == "kubernetes"), f"--kube-auth with auth.mode {mode}")
    if policy_on:
        check(flag_values(argv, "--policy-file") == [POLICY_FILE], "--policy-file")
        check(mounts["policy"]["readOnly"] and mounts["policy"]["mountPath"] == "/etc/gangway/policy",
              "policy mount")
        policy_secret = policy["secretName"] or f"{full}-policy"
        vol = volumes["policy"]["secret"]
        check(vol["secretName"] == policy_secret, "policy Secret name")
        check(vol["items"] == [{"key": policy["key"] if policy["secretName"] else "policy.yaml",
                                "path": "policy.yaml"}], "policy Secret items")
        if policy["secretName"]:
            check(("Secret", f"{full}-policy") not in objs, "a policy Secret made although one is named")
        else:
            made = objs[("Secret", policy_secret)]["stringData"]["policy.yaml"]
            want = expected_policy(values, source)
            check(yaml.safe_load(made) == want, "the policy Secret does not hold auth.policy.inline"
                  + (" and the admin certificate's identity" if admin_in_policy(values, source) else "")
                  + f": {yaml.safe_load(made)}")
            # Every identity as the server requires: a name, roles, and tokens or certificates.
            for ident in (yaml.safe_load(made) or {}).get("identities") or []:
                check(ident.get("name") and ident.get("roles") and (ident.get("tokens") or ident.get("certificates")),
                      f"policy identity {ident}: needs name, roles and tokens or certificates")
    else:
        check("--policy-file" not in " ".join(argv) and "policy" not in mounts,
              f"--policy-file with auth.mode {mode}")
    # Admin tokens: an addition to every mode.
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
    if shared:
        check([p["name"] for p in peers_spec["ports"]] == ["grpc"]
              and peers_spec["ports"][0]["port"] == values["ports"]["grpc"], "peers Service: the shared client port")
    else:
        check([p["name"] for p in peers_spec["ports"]] == ["peer", "grpc"]
              and peers_spec["ports"][0]["port"] == values["ports"]["peer"]
              and peers_spec["ports"][0]["targetPort"] == "peer", "peers Service: the peer port")
    front = objs[("Service", full)]["spec"]["ports"]
    check(len(front) == 1 and front[0]["targetPort"] == "grpc", "front door: the client gRPC port only")
    check(objs[("Service", f"{full}-metrics")]["spec"]["ports"][0]["targetPort"] == "http", "metrics port")
    pdb = objs.get(("PodDisruptionBudget", full))
    check(pdb is not None and pdb["spec"]["maxUnavailable"] == 1, "PodDisruptionBudget maxUnavailable 1")

    # RBAC: exactly the verbs gangway uses (with auth.mode kubernetes, the token and
    # access reviews too), bound to the pods' ServiceAccount; the users' ClusterRoles.
    role = objs[("ClusterRole", f"{NAMESPACE}-{full}")]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    want = RBAC | KUBE_REVIEW if mode == "kubernetes" else RBAC
    check(granted == want, f"ClusterRole grants {sorted(granted - want)} too many, "
                           f"{sorted(want - granted)} too few")
    check_user_roles(objs)
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
        check(config.get("topology-levels", []) == values["cluster"]["topologyLevels"],
              "topology-levels as cluster.topologyLevels gives them")

    # The NetworkPolicy: the peer port from this release's pods only.
    netpol = objs.get(("NetworkPolicy", full))
    if values["networkPolicy"]["enabled"]:
        check(netpol is not None, "no NetworkPolicy")
        check_network_policy(netpol, spec["selector"]["matchLabels"], values, ports)
    else:
        check(netpol is None, "a NetworkPolicy although networkPolicy.enabled is false")

    summary = f"{len(objs)} objects, {replicas} replicas"
    if joiners:
        summary += ", joining: " + ", ".join(f"{full}-{o}" for o in joiners)
    if shared:
        summary += ", Raft on the client port"
    if tls["enabled"]:
        summary += ", mTLS (" + {"secret": "own Secret", "cert-manager": "cert-manager",
                                 "generated": "generated by Helm"}[source]
        summary += ", client certificates " + client_certs(values) + ")"
    summary += {"kubernetes": ", kube-auth", "policy": ", policy", "none": ", NO authorization"}[mode]
    if policy_on and mode == "kubernetes":
        summary += " + policy" + (" (admin certificate)" if admin_in_policy(values, source) else "")
    if auth["enabled"]:
        summary += ", tokens"
    if netpol is not None:
        summary += ", NetworkPolicy"
    if tls_detail:
        summary += "; " + tls_detail
    return summary


def check_notes(notes: str, values: dict, cert_manager: bool = True) -> None:
    """NOTES.txt says what is on and off (TLS and where its certificates come from, client
    certificates, authorization, Raft sharing the client port), how an administrator reaches
    gangctl (the admin certificate, a token, or both), and how to grant a tenant (with the CA
    and a token only when client certificates are optional); its YAML examples parse."""
    full, tls, mode = RELEASE, values["tls"], values["auth"]["mode"]
    source = tls_source(values, cert_manager)
    optional = source != "off" and client_certs(values) == "optional"
    admin_cert = admin_in_policy(values, source)
    uses_cert = source != "off" and (admin_cert or mode != "kubernetes" or not optional)
    uses_token = mode == "kubernetes" and not admin_cert
    check(("Mutual TLS is ON" in notes) == bool(tls["enabled"]), "NOTES: TLS on/off")
    check(("TLS is OFF" in notes) != bool(tls["enabled"]), "NOTES: TLS off warning")
    check(("Certificates generated by Helm" in notes) == (source == "generated"), "NOTES: generated certificates")
    check(("Certificates from cert-manager" in notes) == (source == "cert-manager"), "NOTES: cert-manager")
    if source != "off":
        check(("needs only the CA (ca.crt) to connect" in notes) == optional, "NOTES: optional client certificates")
    if uses_cert and source in ("cert-manager", "generated"):
        check(f"secret {full}-admin-client" in notes, "NOTES: where the admin client certificate is")
    check((f"certificate/{full}-admin-client" in notes) == (uses_cert and source == "cert-manager"),
          "NOTES: waiting for the admin Certificate (cert-manager only)")
    check(("names this certificate an" in notes) == admin_cert, "NOTES: the admin certificate in the policy")
    gangctl = next((line for line in notes.splitlines() if line.strip().startswith("gangctl -s 127.0.0.1")), "")
    check(("--tls-ca" in gangctl) == (source != "off"), "NOTES: gangctl --tls-ca")
    for flag in ("--tls-cert", "--tls-key"):
        check((flag in gangctl) == uses_cert, f"NOTES: gangctl {flag}")
    check(("--token" in gangctl) == uses_token, "NOTES: gangctl --token")
    check((f"--clusterrole={NAMESPACE}-{full}-admin" in notes) == uses_token, "NOTES: an administrator's token")
    shared = peer_shared(values)
    check(("WARNING: Raft shares the client port" in notes) == shared, "NOTES: Raft on the client port")
    if mode == "kubernetes":
        check("Authorization is ON (auth.mode=kubernetes)" in notes, "NOTES: kubernetes authorization")
        tenant = f"--clusterrole={NAMESPACE}-{full}-tenant"
        check("GRANTING A TENANT (auth.mode=kubernetes)" in notes and "create rolebinding" in notes
              and tenant in notes and "create token" in notes, "NOTES: granting a tenant in kubernetes mode")
        line = next((l for l in notes.splitlines() if l.strip().startswith(f"gangctl -s {full}.{NAMESPACE}.svc")), "")
        if optional:  # a tenant connects with the CA and its token only
            check("--tls-ca ca.crt" in line and "--token" in line and "--tls-cert" not in line,
                  f"NOTES: a tenant's gangctl with the CA and a token only: {line!r}")
    elif mode == "policy":
        check("Authorization is ON (auth.mode=policy)" in notes and "GRANTING A TENANT (access policy)" in notes,
              "NOTES: policy mode")
    else:
        check("authorization is OFF" in notes, "NOTES: no authorization warning")
    # The heredoc examples (kubectl apply -f - <<'EOF' ... EOF) are valid objects.
    kinds = []
    for block in re.findall(r"<<'EOF'\n(.*?)\n\s*EOF\n", notes, re.S):
        for doc in yaml.safe_load_all(textwrap.dedent(block)):
            kinds.append(doc["kind"])
            if doc["kind"] == "ClusterRole":
                check(all(r["apiGroups"] == ["gangway.dev"] for r in doc["rules"]), "NOTES: example ClusterRole")
                granted = {(r["resources"][0], v, n) for r in doc["rules"] for v in r["verbs"]
                           for n in r.get("resourceNames", ["*"])}
                check({("queues", "use", "team-a"), ("priorities", "use", "100")} <= granted,
                      "NOTES: example ClusterRole does not grant use of the queue and priorities")
            if doc["kind"] == "Certificate":
                check(doc["spec"]["issuerRef"]["name"] == (tls["issuerRef"] or {}).get("name", f"{full}-ca"),
                      "NOTES: the tenant certificate's issuer")
    if mode == "kubernetes":
        # A tenant's client certificate only when it needs one, from cert-manager.
        want = ["ClusterRole", "ClusterRoleBinding"] + (["Certificate"] if source == "cert-manager" and not optional else [])
        check(kinds == want, f"NOTES: examples {kinds} != {want}")
    if mode == "policy" or (mode == "kubernetes" and (values["auth"]["policy"]["secretName"]
                                                      or values["auth"]["policy"]["inline"])):
        example = notes[notes.index("  identities:"):].split("\n\n")[0]
        ident = yaml.safe_load(textwrap.dedent(example))["identities"][0]
        check(ident["roles"] == ["tenant"] and ident["tenant"]["queues"] == ["team-a"], "NOTES: policy example")


def dns_matches(pattern: str, name: str) -> bool:
    """Whether a certificate's DNS name covers `name` (a wildcard covers one label)."""
    if pattern.startswith("*."):
        head, _, rest = name.partition(".")
        return bool(head) and rest == pattern[2:]
    return pattern == name


def check_certificates(objs: dict, values: dict, peer_hosts: list[str]) -> None:
    """cert-manager objects: the CA chain (unless tls.issuerRef), the replicas' Certificate
    with subject O=gangway:peers covering every replica and the client Service, and the
    admin client Certificate, which is no peer certificate."""
    full, tls = RELEASE, values["tls"]
    for (kind, name), obj in objs.items():
        if kind in ("Certificate", "Issuer"):
            check(obj["apiVersion"] == "cert-manager.io/v1" and obj["metadata"]["namespace"] == NAMESPACE,
                  f"{kind} {name}: apiVersion or namespace")
    if tls["issuerRef"]:
        issuer = {"kind": "Issuer", "group": "cert-manager.io", **tls["issuerRef"]}
        check(not any(k == "Issuer" for k, _ in objs), "the chart's CA made although tls.issuerRef is set")
    else:
        issuer = {"name": f"{full}-ca", "kind": "Issuer", "group": "cert-manager.io"}
        selfsigned = objs[("Issuer", f"{full}-selfsigned")]["spec"]
        check(selfsigned == {"selfSigned": {}}, "self-signed Issuer")
        ca = objs[("Certificate", f"{full}-ca")]["spec"]
        check(ca["isCA"] is True and ca["issuerRef"]["name"] == f"{full}-selfsigned", "CA Certificate")
        check(PEER_ORGANIZATION not in ca.get("subject", {}).get("organizations", []), "the CA is a peer")
        ca_issuer = objs[("Issuer", f"{full}-ca")]["spec"]
        check(ca_issuer == {"ca": {"secretName": ca["secretName"]}}, "CA Issuer does not use the CA's Secret")

    peer = objs.get(("Certificate", f"{full}-tls"))
    check(peer is not None, "no Certificate for the replicas")
    spec = peer["spec"]
    check(spec["secretName"] == f"{full}-tls", "replicas' Certificate Secret")
    check(spec.get("subject", {}).get("organizations") == [PEER_ORGANIZATION],
          f"replicas' Certificate: subject organizations must be exactly [{PEER_ORGANIZATION}]")
    check(spec["issuerRef"] == issuer, f"replicas' Certificate issuerRef {spec['issuerRef']} != {issuer}")
    check({"server auth", "client auth"} <= set(spec["usages"]), "replicas' Certificate usages")
    names = spec["dnsNames"]
    for h in peer_hosts:
        check(any(dns_matches(n, h) for n in names), f"replicas' Certificate does not cover {h}")
    want = set(want_dns_names(values))
    check(set(names) == want, f"replicas' Certificate dnsNames {sorted(names)} != {sorted(want)}")
    check(spec["ipAddresses"] == ["127.0.0.1"], "replicas' Certificate IP addresses")

    admin = objs.get(("Certificate", f"{full}-admin-client"))
    check(admin is not None, "no admin client Certificate")
    a = admin["spec"]
    check(a["commonName"] == "gangway-admin" and a["secretName"] == f"{full}-admin-client", "admin Certificate")
    check(PEER_ORGANIZATION not in a.get("subject", {}).get("organizations", []),
          "the admin client certificate is a peer certificate")
    check("client auth" in a["usages"] and "server auth" not in a["usages"], "admin Certificate usages")
    check(a["issuerRef"] == issuer, "admin Certificate issuerRef")
    peers = [n for (k, n), o in objs.items() if k == "Certificate"
             and PEER_ORGANIZATION in o["spec"].get("subject", {}).get("organizations", [])]
    check(peers == [f"{full}-tls"], f"peer certificates: {peers}")


def check_user_roles(objs: dict) -> None:
    """The ClusterRoles for gangway's users grant exactly USER_ROLES in gangway.dev."""
    for role, want in USER_ROLES.items():
        obj = objs.get(("ClusterRole", f"{NAMESPACE}-{RELEASE}-{role}"))
        check(obj is not None, f"no ClusterRole {NAMESPACE}-{RELEASE}-{role}")
        granted = set()
        for rule in obj["rules"]:
            check(rule["apiGroups"] == ["gangway.dev"] and not rule.get("resourceNames"),
                  f"{role} ClusterRole: a rule outside gangway.dev or with resourceNames")
            granted |= {(r, v) for r in rule["resources"] for v in rule["verbs"]}
        check(granted == want, f"{role} ClusterRole grants {sorted(granted - want)} too many, "
                               f"{sorted(want - granted)} too few")


def check_network_policy(netpol: dict, selector: dict, values: dict, ports: dict) -> None:
    """Ingress only; every rule names its sources and ports; the peer port only from this
    release's pods; the client port from networkPolicy.clients and those pods; HTTP from
    networkPolicy.http."""
    spec = netpol["spec"]
    check(spec["podSelector"] == {"matchLabels": selector}, "NetworkPolicy selects other pods")
    check(spec["policyTypes"] == ["Ingress"], "NetworkPolicy must restrict ingress only")
    self_peer = {"podSelector": {"matchLabels": selector}}
    by_port: dict[str, list] = {}
    for rule in spec["ingress"]:
        check(rule.get("from") and rule.get("ports"),
              "a NetworkPolicy rule without sources or ports opens the pods to everyone")
        for port in rule["ports"]:
            name = port["port"]
            name = next((n for n, p in ports.items() if p == name), name)
            check(name in ports, f"NetworkPolicy names port {port['port']}, not the container's")
            check(name not in by_port, f"port {name} in two NetworkPolicy rules")
            by_port[name] = rule["from"]
    if "peer" in ports:
        check(by_port.get("peer") == [self_peer], f"peer port open to {by_port.get('peer')}")
    else:  # Raft shares the client port: the rule below opens it to clients and replicas
        check("peer" not in by_port, "a NetworkPolicy rule for a peer port the pods do not have")
    np = values["networkPolicy"]
    check(by_port.get("grpc") == [self_peer] + np["clients"], "client port sources")
    check(by_port.get("http") == (np["http"] or None), "HTTP port sources")


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
    volcano = objs[("CustomResourceDefinition", "podgroups.scheduling.volcano.sh")]
    v_version = volcano["spec"]["versions"][0]
    check(v_version["name"] == "v1beta1" and v_version["subresources"] == {"status": {}},
          "Volcano PodGroup CRD version")
    v_props = v_version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    check({"minMember", "minTaskMember", "queue"} <= set(v_props), "Volcano PodGroup CRD spec fields")
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


def check_secure_defaults(objs: dict) -> str:
    """What the default values must install, checked on the manifest itself: mutual TLS with
    a peer certificate (O=gangway:peers from cert-manager, or CN gangway:peers generated by
    Helm), client certificates optional for token holders, --kube-auth with the admin
    certificate's identity in the policy, a separate peer port, the NetworkPolicy closing the
    peer port to all but the release's pods, the review rules and the users' ClusterRoles."""
    full = RELEASE
    (container,) = objs[("StatefulSet", full)]["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    for flag in ("--tls-cert", "--tls-key", "--tls-client-ca", "--peer-listen"):
        check(any(a.startswith(flag + "=") for a in args), f"default: no {flag}")
    check("--kube-auth" in args, "default: no --kube-auth")
    check("--tls-client-certs=optional" in args, "default: no --tls-client-certs=optional")
    check(f"--policy-file={POLICY_FILE}" in args, "default: no --policy-file")
    policy = yaml.safe_load(objs[("Secret", f"{full}-policy")]["stringData"]["policy.yaml"])
    check(policy == {"identities": [ADMIN_IDENTITY]}, f"default: policy {policy}")
    if ("Certificate", f"{full}-tls") in objs:
        peer = objs[("Certificate", f"{full}-tls")]["spec"]
        check(PEER_ORGANIZATION in peer["subject"]["organizations"], "default: no peer organization")
        how = "O=gangway:peers (cert-manager)"
    else:
        check(("Secret", f"{full}-tls") in objs and ("Secret", f"{full}-admin-client") in objs,
              "default without cert-manager: no generated certificates")
        how = "CN gangway:peers (generated)"
    rules = objs[("NetworkPolicy", full)]["spec"]["ingress"]
    selector = objs[("StatefulSet", full)]["spec"]["selector"]
    peer_rules = [r for r in rules if any(p["port"] == "peer" for p in r["ports"])]
    check(len(peer_rules) == 1 and peer_rules[0]["from"] == [{"podSelector": selector}],
          "default: the peer port is open beyond the release's pods")
    own = objs[("ClusterRole", f"{NAMESPACE}-{full}")]["rules"]
    for group, resource in (("authentication.k8s.io", "tokenreviews"), ("authorization.k8s.io", "subjectaccessreviews")):
        check(any(group in r["apiGroups"] and resource in r["resources"] and "create" in r["verbs"] for r in own),
              f"default: gangway may not create {resource}")
    for role in USER_ROLES:
        check(("ClusterRole", f"{NAMESPACE}-{full}-{role}") in objs, f"default: no {role} ClusterRole")
    return (f"secure defaults: mTLS with {how}, tokens without client certificates, --kube-auth, "
            "the admin certificate in the policy, peer port for the release's pods only")


# An access policy in the format the chart README documents: a tenant and a node agent
# (POLICY_TENANTS), and with an administrator by certificate (POLICY_EXAMPLE).
POLICY_TENANTS = """identities:
  - name: team-a
    roles: [tenant]
    tokens: ["sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
    tenant:
      namespaces: [team-a]
      queues: [team-a]
      defaultQueue: team-a
      maxPriority: 100
  - name: node-7
    roles: [node]
    tokens: ["a-long-random-token-for-node-7"]
    nodes: [node-7]
"""
POLICY_EXAMPLE = POLICY_TENANTS.replace("identities:\n", """identities:
  - name: ops
    roles: [admin]
    certificates: [gangway-admin]
""", 1)


# --- cases ----------------------------------------------------------------------------------


SCHEDULER_CONFIG = """apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: gangway
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
"""


def check_scheduler_config(objs: dict) -> str:
    """scheduler.config lands beside gangway.toml, which names it as scheduler-config."""
    data = next(o for (k, n), o in objs.items() if k == "ConfigMap" and n.endswith("-config"))["data"]
    check(data.get("scheduler-config.yaml", "").strip() == SCHEDULER_CONFIG.strip(),
          "the ConfigMap holds scheduler.config as scheduler-config.yaml")
    if tomllib is not None:
        config = tomllib.loads(data["gangway.toml"])
        check(config.get("scheduler-config") == "/etc/gangway/config/scheduler-config.yaml",
              "gangway.toml names the scheduler configuration")
    return "scheduler-config.yaml in the ConfigMap and named by gangway.toml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--show", metavar="CASE",
                        help="print the rendered manifest of CASE (default, default-no-cert-manager, "
                             "a ci file's stem, optional, ...: the stems in helm/README.md)")
    args = parser.parse_args()

    api = FakeApiServer()                 # a cluster without cert-manager
    api_cm = FakeApiServer(CERT_MANAGER)  # one with cert-manager: the default's certificates
    scratch = Path(tempfile.mkdtemp(prefix="gangway-helm-"))
    results: list[bool] = []
    shown = False

    def report(ok: bool, name: str, detail: str) -> None:
        results.append(ok)
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)

    def valid_case(case: str, name: str, override: dict | None, extra=None, server=None) -> None:
        nonlocal shown
        server = server or api_cm
        try:
            messages = lint_with(api, override, scratch)
            bad = [(s, p) for s, p in messages if s >= LINT_WARNING]
            infos = len(messages) - len(bad)
            problems = []
            if bad:
                problems.append("helm lint: " + ", ".join(f"{SEVERITY.get(s, s)} in {p}" for s, p in bad))
            try:
                release = render_release(server, override)
                manifest, notes = release["manifest"], release["info"]["notes"]
            except helm_sdkpy.HelmError as e:
                problems.append(f"render: {e}")
            check(not problems, "; ".join(problems))
            if args.show == case:
                print(manifest)
                shown = True
            objs = parse(manifest)
            values = coalesce(chart_values(), override or {})
            detail = check_release(objs, values, scratch, cert_manager=server is api_cm)
            check_notes(notes, values, cert_manager=server is api_cm)
            if extra:
                detail += "; " + extra(objs)
            report(True, name, f"lint clean ({infos} info), {detail}")
        except Failed as e:
            report(False, name, str(e))
        except Exception as e:  # a broken check is a failed case, not a crash
            report(False, name, f"{type(e).__name__}: {e}")

    def refused_case(name: str, override: dict, expect: str, preset: dict | None = None,
                     server=None) -> None:
        try:
            render(server or api_cm, override, preset)
        except helm_sdkpy.HelmError as e:
            message = str(e)
            if expect in message:
                report(True, name, "refused: " + message[message.index(expect):].splitlines()[0])
            else:
                report(False, name, f"refused, but not with {expect!r}: {message}")
            return
        report(False, name, "rendered; it must be refused")

    def owned(obj: dict) -> dict:
        """obj as the API server would hold it for this release (Helm adopts it on install)."""
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta["namespace"] = NAMESPACE
        meta.setdefault("labels", {})["app.kubernetes.io/managed-by"] = "Helm"
        meta.setdefault("annotations", {}).update({"meta.helm.sh/release-name": RELEASE,
                                                   "meta.helm.sh/release-namespace": NAMESPACE})
        return obj

    def secret_path(name: str) -> str:
        return f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}"

    def live_statefulset(env: dict, replicas: int = 3, peer_listen: bool = False) -> dict:
        """A running StatefulSet of this release with the container env `env` (the Raft port
        and id overrides it was rendered with)."""
        args = ["--log-format=json"] + (["--peer-listen=0.0.0.0:7071"] if peer_listen else [])
        return {f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/{RELEASE}": owned({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": RELEASE, "annotations": {"gangway/initial-replicas": str(replicas)}},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [{
                "name": "gangway", "args": args,
                "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
                       + [{"name": k, "value": v} for k, v in env.items()]}]}}}})}

    def preset_case(name: str, override: dict | None, preset: dict, server=None) -> None:
        """Renders against a cluster holding `preset` and checks the release."""
        server = server or api_cm
        try:
            values = coalesce(chart_values(), override or {})
            release = render_release(server, override, preset)
            detail = check_release(parse(release["manifest"]), values, scratch, cert_manager=server is api_cm)
            check_notes(release["info"]["notes"], values, cert_manager=server is api_cm)
            report(True, name, detail)
        except (Failed, helm_sdkpy.HelmError) as e:
            report(False, name, str(e))

    try:
        valid_case("default", "default values (cluster with cert-manager)", None, check_secure_defaults)
        valid_case("default-no-cert-manager", "default values (cluster without cert-manager: Helm generates the certificates)",
                   None, check_secure_defaults, server=api)
        valid_case("cert-manager-false", "tls.certManager=false on a cluster with cert-manager",
                   {"tls": {"certManager": False}})
        for values_file in sorted((CHART / "ci").glob("*-values.yaml")):
            override = yaml.safe_load(values_file.read_text()) or {}
            case = values_file.name[: -len("-values.yaml")]
            tls = override.get("tls") or {}
            # A file naming its own certificate Secret (or without TLS) must not need cert-manager.
            own = tls.get("secretName") or tls.get("enabled") is False
            valid_case(case, f"ci/{values_file.name}" + (" (cluster without cert-manager)" if own else ""),
                       override, server=api if own else api_cm)
        valid_case("optional", "podGroupCRD, volcanoPodGroupCRD, elasticQuotaCRD, serviceMonitor and dashboards enabled",
                   {"podGroupCRD": {"enabled": True}, "volcanoPodGroupCRD": {"enabled": True}, "elasticQuotaCRD": {"enabled": True}, "metrics": {"serviceMonitor": {"enabled": True}},
                    "dashboards": {"enabled": True}}, check_optional)

        valid_case("scheduler-config", "scheduler.config: a kube-scheduler configuration in the ConfigMap",
                   {"scheduler": {"config": SCHEDULER_CONFIG}}, check_scheduler_config)

        # Authorization modes.
        valid_case("policy-inline", "auth.mode=policy, auth.policy.inline (generated certificates)",
                   {"auth": {"mode": "policy", "policy": {"inline": POLICY_EXAMPLE}}}, server=api)
        valid_case("policy-secret", "auth.mode=policy, auth.policy.secretName",
                   {"auth": {"mode": "policy", "policy": {"secretName": "my-policy", "key": "access.yaml"}}})
        valid_case("kube-and-policy", "auth.mode=kubernetes with a policy naming gangway-admin, and admin tokens",
                   {"auth": {"policy": {"inline": POLICY_EXAMPLE}, "enabled": True, "secretName": "tokens"}})
        valid_case("kube-policy-merged", "auth.mode=kubernetes, auth.policy.inline merged with the admin certificate's identity",
                   {"auth": {"policy": {"inline": POLICY_TENANTS}}}, server=api)
        valid_case("kube-policy-secret", "auth.mode=kubernetes, auth.policy.secretName (no admin identity added)",
                   {"auth": {"policy": {"secretName": "my-policy"}}})
        valid_case("no-admin-certificate", "auth.adminCertificate=false: administrators use a Kubernetes token",
                   {"auth": {"adminCertificate": False}}, server=api)
        valid_case("client-certs-required", "tls.clientCerts=required in auth.mode kubernetes",
                   {"tls": {"clientCerts": "required"}})
        valid_case("client-certs-optional-policy", "tls.clientCerts=optional in auth.mode policy",
                   {"tls": {"clientCerts": "optional"}, "auth": {"mode": "policy", "policy": {"inline": POLICY_EXAMPLE}}},
                   server=api)
        valid_case("auth-none", "auth.mode=none", {"auth": {"mode": "none"}})
        # TLS: off (no cert-manager needed), and cert-manager with another issuer and domain.
        valid_case("insecure", "tls.enabled=false, networkPolicy.enabled=false (cluster without cert-manager)",
                   {"tls": {"enabled": False}, "networkPolicy": {"enabled": False}}, server=api)
        valid_case("issuer", "tls.issuerRef, cluster.clusterDomain, tls.extraDnsNames, no other clients",
                   {"tls": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"},
                            "extraDnsNames": ["gangway.example.com"]},
                    "cluster": {"clusterDomain": "cluster.local"},
                    "networkPolicy": {"clients": [], "http": [{"namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]}})
        valid_case("generated-domain", "generated certificates with cluster.clusterDomain and tls.extraDnsNames",
                   {"tls": {"extraDnsNames": ["gangway.example.com"], "generatedDays": 400},
                    "cluster": {"clusterDomain": "cluster.local"}}, server=api)
        # Raft on the client port (upgrades from charts before the peer port).
        valid_case("peer-shared", "ports.peer = ports.grpc: Raft shares the client port",
                   {"ports": {"peer": 7070}})
        valid_case("peer-null", "ports.peer=null: Raft shares the client port (no cert-manager)",
                   {"ports": {"peer": None}}, server=api)
        valid_case("upgrade-earlier", "the values for upgrading from an earlier chart (shared port, TLS off, auth.mode none)",
                   {"ports": {"peer": 7070}, "tls": {"enabled": False}, "auth": {"mode": "none"}}, server=api)

        refused_case("replicaCount=4 refused", {"replicaCount": 4}, "replicaCount must be odd")
        refused_case("tls.certManager=maybe refused", {"tls": {"certManager": "maybe"}},
                     "tls.certManager must be auto, true or false")
        refused_case("tls.clientCerts=maybe refused", {"tls": {"clientCerts": "maybe"}},
                     "tls.clientCerts must be auto, required or optional")
        refused_case("tls.generatedDays=0 refused", {"tls": {"generatedDays": 0}}, "tls.generatedDays must be at least 1")
        refused_case("auth.mode=kubernetes with scheduler.inCluster=false refused",
                     {"scheduler": {"inCluster": False}}, "auth.mode kubernetes checks tokens")
        refused_case("auth.mode=policy without a policy refused", {"auth": {"mode": "policy"}},
                     "auth.mode policy needs the access policy")
        refused_case("auth.policy.inline without identities refused",
                     {"auth": {"mode": "policy", "policy": {"inline": "roles: [admin]\n"}}},
                     "the policy needs a list `identities`")
        refused_case("an inline identity gangway-admin without the admin certificate refused",
                     {"auth": {"policy": {"inline": "identities:\n  - {name: gangway-admin, roles: [viewer], "
                                                    "tokens: [a-long-random-token-for-x]}\n"}}},
                     "identity gangway-admin is the chart's name for the admin client certificate")
        refused_case("auth.mode=open refused", {"auth": {"mode": "open"}}, "auth.mode must be kubernetes, policy or none")
        refused_case("ports.peer = ports.http refused", {"ports": {"peer": 9090}}, "ports.peer and ports.http are both 9090")

        # Generated certificates are kept: a second render against a cluster that holds the
        # first render's Secrets (lookup) reuses them, and a render without them makes new ones.
        name = "generated certificates reused on upgrade (lookup)"
        try:
            kept = [f"{RELEASE}-tls", f"{RELEASE}-admin-client", f"{RELEASE}-peer"]
            first = parse(render(api, None))
            preset = {secret_path(n): owned(first[("Secret", n)]) for n in kept}
            second = parse(render(api, None, preset))
            for n in kept:
                check(second[("Secret", n)]["data"] == first[("Secret", n)]["data"], f"Secret {n} not reused")
            fresh = parse(render(api, None))
            check(fresh[("Secret", kept[0])]["data"]["ca.crt"] != first[("Secret", kept[0])]["data"]["ca.crt"],
                  "a render without the Secrets in the cluster did not make a new CA")
            report(True, name, "a second render keeps the CA, both certificates and the peer secret; "
                               "without them in the cluster a new CA is made")
        except (Failed, helm_sdkpy.HelmError, KeyError) as e:
            report(False, name, f"{type(e).__name__}: {e}")
        refused_case("generated certificates with the admin Secret missing refused", {},
                     f"Secret {RELEASE}-tls holds the certificates Helm generated", server=api,
                     preset={secret_path(f"{RELEASE}-tls"): owned(first[("Secret", f"{RELEASE}-tls")])})

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
        preset_case("scaling 3 -> 5 with cluster.initialReplicas=3", {"replicaCount": 5, "cluster": {"initialReplicas": 3}}, live)

        preset_case("cluster.topologyLevels: two hierarchies", {"cluster": {
            "topologyLabel": "example.com/rack",
            "topologyLevels": ["example.com/block,example.com/rack,kubernetes.io/hostname",
                               "example.com/nvlink"]}}, {})

        # A replica that lost its disk comes back under a new node id, joining.
        preset_case('cluster.idOverrides {"1": 101}', {"cluster": {"idOverrides": {"1": 101}}}, {})
        refused_case("reusing a node id refused", {"cluster": {"idOverrides": {"1": 3}}},
                     "node id 3 is already used")

        # Upgrading a cluster of the earlier chart (Raft on the client port, GANGWAY_GRPC_PORT):
        # moving Raft to the peer port under the same node ids is refused; keeping it shared,
        # or every running ordinal under a new id, renders.
        earlier = live_statefulset({"GANGWAY_GRPC_PORT": "7070", "GANGWAY_ID_OVERRIDES": ""})
        refused_case("earlier chart's cluster: moving Raft to the peer port under the same ids refused", {},
                     "the running replicas serve Raft on port 7070", preset=earlier)
        refused_case("earlier chart's cluster: new ids for some ordinals only refused",
                     {"cluster": {"idOverrides": {"2": 103}}}, "would cut gangway-0, gangway-1 off", preset=earlier)
        preset_case("earlier chart's cluster: ports.peer = ports.grpc", {"ports": {"peer": 7070}}, earlier)
        preset_case("earlier chart's cluster: the peer port with new ids for every ordinal",
                    {"cluster": {"idOverrides": {"0": 101, "1": 102, "2": 103}}}, earlier)
        preset_case("this chart's cluster (peer port 7071): the default values again", None,
                    live_statefulset({"GANGWAY_PEER_PORT": "7071", "GANGWAY_ID_OVERRIDES": ""}, peer_listen=True))
        refused_case("this chart's cluster (peer port 7071): ports.peer = ports.grpc refused", {"ports": {"peer": 7070}},
                     "the running replicas serve Raft on port 7071",
                     preset=live_statefulset({"GANGWAY_PEER_PORT": "7071", "GANGWAY_ID_OVERRIDES": "1=101"}, peer_listen=True))

        # Every value is documented in the chart README's table.
        readme = (CHART / "README.md").read_text()
        paths = list(leaf_paths(chart_values()))
        missing = [p for p in paths if f"`{p}`" not in readme]
        report(not missing, "values documented in helm/gangway/README.md",
               f"{len(paths)} values" if not missing else f"missing {', '.join(missing)}")
    finally:
        api.close()
        api_cm.close()
        shutil.rmtree(scratch, ignore_errors=True)

    if args.show and not shown:
        print(f"no rendered case named {args.show!r}", file=sys.stderr)
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if all(results) and (shown or not args.show) else 1


if __name__ == "__main__":
    sys.exit(main())
