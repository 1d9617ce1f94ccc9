{{/*
Chart name.
*/}}
{{- define "gangway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's objects. At most 52 characters: the StatefulSet's pods carry a
controller-revision-hash label of the name plus 11 characters, and labels stop at 63.
*/}}
{{- define "gangway.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gangway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gangway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gangway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gangway.labels" -}}
helm.sh/chart: {{ include "gangway.chart" . }}
{{ include "gangway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gangway
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The headless Service through which the replicas find each other.
*/}}
{{- define "gangway.peersService" -}}
{{- printf "%s-peers" (include "gangway.fullname" .) }}
{{- end }}

{{- define "gangway.metricsService" -}}
{{- printf "%s-metrics" (include "gangway.fullname" .) }}
{{- end }}

{{- define "gangway.configName" -}}
{{- printf "%s-config" (include "gangway.fullname" .) }}
{{- end }}

{{- define "gangway.peerSecretName" -}}
{{- default (printf "%s-peer" (include "gangway.fullname" .)) .Values.peerSecret.secretName }}
{{- end }}

{{- define "gangway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gangway.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gangway.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (toString $tag) }}
{{- end }}
{{- end }}

{{/*
Members that bootstrapped the cluster: cluster.initialReplicas, or replicaCount when 0.
*/}}
{{- define "gangway.initialReplicas" -}}
{{- $n := int (default 0 .Values.cluster.initialReplicas) }}
{{- if gt $n 0 }}{{ $n }}{{ else }}{{ int .Values.replicaCount }}{{ end }}
{{- end }}

{{/*
DNS suffix of the peer names after the namespace: "svc" or "svc.<clusterDomain>".
*/}}
{{- define "gangway.dnsSuffix" -}}
{{- if .Values.cluster.clusterDomain }}
{{- printf "svc.%s" (trimPrefix "." .Values.cluster.clusterDomain) }}
{{- else }}svc{{ end }}
{{- end }}

{{/*
host:port for a listener on bindAddress (IPv6 addresses in brackets).
*/}}
{{- define "gangway.listenAddr" -}}
{{- $host := .host }}
{{- if and (contains ":" $host) (not (hasPrefix "[" $host)) }}
{{- $host = printf "[%s]" $host }}
{{- end }}
{{- printf "%s:%d" $host (int .port) }}
{{- end }}

{{/*
"ordinal=id ..." for the id overrides, in ordinal order.
*/}}
{{- define "gangway.idOverrides" -}}
{{- $pairs := list }}
{{- range $ordinal, $id := .Values.cluster.idOverrides }}
{{- $pairs = append $pairs (printf "%s=%d" $ordinal (int $id)) }}
{{- end }}
{{- join " " $pairs }}
{{- end }}

{{/*
A whole number, or fail naming the value.
*/}}
{{- define "gangway.requireInt" -}}
{{- $v := index . 1 }}
{{- if not (or (kindIs "float64" $v) (kindIs "int64" $v) (kindIs "int" $v)) }}
{{- fail (printf "%s must be a whole number, got %v" (index . 0) $v) }}
{{- end }}
{{- if ne (toString $v) (toString (int $v)) }}
{{- fail (printf "%s must be a whole number, got %v" (index . 0) $v) }}
{{- end }}
{{- end }}

{{/*
Checks the values; fails with a message naming the value at fault.
*/}}
{{- define "gangway.validate" -}}
{{- include "gangway.requireInt" (list "replicaCount" .Values.replicaCount) }}
{{- $replicas := int .Values.replicaCount }}
{{- if lt $replicas 1 }}
{{- fail (printf "replicaCount must be at least 1, got %d" $replicas) }}
{{- end }}
{{- if eq (mod $replicas 2) 0 }}
{{- fail (printf "replicaCount must be odd (1, 3, 5, 7), got %d: %d Raft voters need %d for a majority, so they tolerate no more failures (%d) than %d do; use %d or %d" $replicas $replicas (add (div $replicas 2) 1) (sub (div $replicas 2) 1) (sub $replicas 1) (sub $replicas 1) (add $replicas 1)) }}
{{- end }}
{{- include "gangway.requireInt" (list "cluster.initialReplicas" (default 0 .Values.cluster.initialReplicas)) }}
{{- $initial := int (include "gangway.initialReplicas" .) }}
{{- if eq (mod $initial 2) 0 }}
{{- fail (printf "cluster.initialReplicas must be odd (the size the cluster was created with), got %d" $initial) }}
{{- end }}
{{- if gt $initial $replicas }}
{{- fail (printf "cluster.initialReplicas (%d) cannot exceed replicaCount (%d): to shrink the cluster, change the Raft membership first, then lower both (see README: scaling)" $initial $replicas) }}
{{- end }}
{{- include "gangway.requireInt" (list "cluster.shards" .Values.cluster.shards) }}
{{- $shards := int .Values.cluster.shards }}
{{- if or (lt $shards 1) (gt $shards 256) }}
{{- fail (printf "cluster.shards must be in 1..256, got %d" $shards) }}
{{- end }}
{{- if not (regexMatch "^[A-Za-z0-9_-]+$" (toString .Values.cluster.id)) }}
{{- fail (printf "cluster.id %q: use letters, digits, '-' and '_'" (toString .Values.cluster.id)) }}
{{- end }}
{{- $raft := .Values.cluster.raft }}
{{- if not (and (gt (int $raft.heartbeatMs) 0) (lt (int $raft.heartbeatMs) (int $raft.electionMinMs)) (lt (int $raft.electionMinMs) (int $raft.electionMaxMs))) }}
{{- fail "cluster.raft: need 0 < heartbeatMs < electionMinMs < electionMaxMs" }}
{{- end }}
{{- if lt (int $raft.snapshotEvery) 1 }}
{{- fail "cluster.raft.snapshotEvery must be at least 1" }}
{{- end }}
{{- $conc := int .Values.scheduler.bindConcurrency }}
{{- if or (lt $conc 1) (gt $conc 4096) }}
{{- fail (printf "scheduler.bindConcurrency must be in 1..4096, got %d" $conc) }}
{{- end }}
{{- if not (has .Values.logFormat (list "text" "json")) }}
{{- fail (printf "logFormat must be text or json, got %v" .Values.logFormat) }}
{{- end }}
{{- include "gangway.validatePorts" . }}
{{- include "gangway.validateTls" . }}
{{- include "gangway.validateAuth" . }}
{{- if and .Values.auth.enabled (not .Values.auth.secretName) }}
{{- fail "auth.enabled needs auth.secretName: the Secret whose key auth.key holds the bearer tokens, one per line" }}
{{- end }}
{{- if not (has (toString .Values.podAntiAffinity.type) (list "required" "preferred" "")) }}
{{- fail (printf "podAntiAffinity.type must be required, preferred or empty, got %v" .Values.podAntiAffinity.type) }}
{{- end }}
{{- $ids := dict }}
{{- range $ordinal := until $replicas }}
{{- $_ := set $ids (toString (add $ordinal 1)) (printf "ordinal %d" $ordinal) }}
{{- end }}
{{- range $ordinal, $id := .Values.cluster.idOverrides }}
{{- if not (regexMatch "^[0-9]+$" $ordinal) }}
{{- fail (printf "cluster.idOverrides: key %q is not a pod ordinal" $ordinal) }}
{{- end }}
{{- include "gangway.requireInt" (list (printf "cluster.idOverrides.%s" $ordinal) $id) }}
{{- if lt (int $id) 1 }}
{{- fail (printf "cluster.idOverrides.%s: node ids start at 1" $ordinal) }}
{{- end }}
{{- end }}
{{- range $ordinal, $id := .Values.cluster.idOverrides }}
{{- $key := toString (int $id) }}
{{- if hasKey $ids $key }}
{{- fail (printf "cluster.idOverrides.%s: node id %s is already used by %s; node ids are never reused" $ordinal $key (get $ids $key)) }}
{{- end }}
{{- $_ := set $ids $key (printf "ordinal %s" $ordinal) }}
{{- end }}
{{- end }}

{{/*
Refuses an upgrade that would let pods which did not exist when the cluster was created
bootstrap it again: the StatefulSet records the members it was created with.
*/}}
{{- define "gangway.checkUpgrade" -}}
{{- $live := lookup "apps/v1" "StatefulSet" .Release.Namespace (include "gangway.fullname" .) }}
{{- if $live }}
{{- $recorded := "" }}
{{- with $live.metadata.annotations }}
{{- $recorded = index . "gangway/initial-replicas" | default "" }}
{{- end }}
{{- $initial := int (include "gangway.initialReplicas" .) }}
{{- if and $recorded (gt $initial (int $recorded)) }}
{{- fail (printf "this cluster was created with %s members, but cluster.initialReplicas resolves to %d: pods %s-%s and up would bootstrap instead of joining. Set cluster.initialReplicas=%s (see README: scaling)" $recorded $initial (include "gangway.fullname" .) $recorded $recorded) }}
{{- end }}
{{- include "gangway.checkPeerPortMove" (dict "ctx" . "live" $live) }}
{{- end }}
{{- end }}

{{/*
Refuses moving the Raft transport of running replicas to another port under their node ids:
the Raft membership keeps each member's address with the port it advertised, so they would
be cut off from each other. The live pod template tells the port (GANGWAY_PEER_PORT, or
GANGWAY_GRPC_PORT in charts before the peer port) and the ids (GANGWAY_ID_OVERRIDES).
Moving is allowed when every running ordinal comes back under a new id (README: "Upgrading
from an earlier chart").
*/}}
{{- define "gangway.checkPeerPortMove" -}}
{{- $ctx := .ctx }}
{{- $containers := dig "spec" "template" "spec" "containers" (list) .live }}
{{- $env := dict }}
{{- range $containers }}
{{- if eq (toString .name) "gangway" }}
{{- range (default (list) .env) }}
{{- if hasKey . "value" }}{{ $_ := set $env (toString .name) (toString .value) }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- $livePort := default (get $env "GANGWAY_GRPC_PORT") (get $env "GANGWAY_PEER_PORT") }}
{{- $newPort := include "gangway.peerPort" $ctx }}
{{- if and $livePort (ne $livePort $newPort) }}
{{- $liveIds := dict }}
{{- range (splitList " " (get $env "GANGWAY_ID_OVERRIDES")) }}
{{- if contains "=" . }}{{ $_ := set $liveIds (first (splitList "=" .)) (last (splitList "=" .)) }}{{ end }}
{{- end }}
{{- $newIds := dict }}
{{- range $ordinal, $id := $ctx.Values.cluster.idOverrides }}
{{- $_ := set $newIds (toString $ordinal) (toString (int $id)) }}
{{- end }}
{{- $running := int (dig "spec" "replicas" 0 .live) }}
{{- $kept := list }}
{{- range $ordinal := until (min $running (int $ctx.Values.replicaCount) | int) }}
{{- $key := toString $ordinal }}
{{- $default := toString (add $ordinal 1) }}
{{- if eq (default $default (get $liveIds $key)) (default $default (get $newIds $key)) }}
{{- $kept = append $kept (printf "%s-%d" (include "gangway.fullname" $ctx) $ordinal) }}
{{- end }}
{{- end }}
{{- if $kept }}
{{- $hint := printf "keep ports.peer=%s" $livePort }}
{{- if eq $livePort (toString (int $ctx.Values.ports.grpc)) }}
{{- $hint = printf "keep ports.peer equal to ports.grpc (%s): Raft then shares the client port as before" $livePort }}
{{- end }}
{{- fail (printf "the running replicas serve Raft on port %s, and the Raft membership keeps each member's address with that port: moving it to %s under the same node ids would cut %s off from the other replicas. For this upgrade, %s; to move, replace the members under new node ids (chart README: \"Upgrading from an earlier chart\")" $livePort $newPort (join ", " $kept) $hint) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Cluster-scoped RBAC objects carry the namespace too, so releases of the same name in two
namespaces do not collide.
*/}}
{{- define "gangway.clusterRoleName" -}}
{{- printf "%s-%s" .Release.Namespace (include "gangway.fullname" .) }}
{{- end }}

{{/*
Whether Raft shares the client port: ports.peer null or equal to ports.grpc (as in charts
before the separate peer port). "true" or empty.
*/}}
{{- define "gangway.peerShared" -}}
{{- $peer := index .Values.ports "peer" }}
{{- if or (kindIs "invalid" $peer) (eq (toString $peer) (toString .Values.ports.grpc)) }}true{{ end }}
{{- end }}

{{/*
The port replicas advertise for Raft (--advertise, --peer): ports.peer, or the client port
when they share it.
*/}}
{{- define "gangway.peerPort" -}}
{{- if include "gangway.peerShared" . }}{{ int .Values.ports.grpc }}{{ else }}{{ int .Values.ports.peer }}{{ end }}
{{- end }}

{{/*
The ports differ from each other, except ports.peer, which may equal ports.grpc (Raft then
shares the client port).
*/}}
{{- define "gangway.validatePorts" -}}
{{- $names := list "grpc" "http" }}
{{- if not (include "gangway.peerShared" .) }}
{{- $names = list "grpc" "peer" "http" }}
{{- end }}
{{- $seen := dict }}
{{- range $name := $names }}
{{- $port := index $.Values.ports $name }}
{{- include "gangway.requireInt" (list (printf "ports.%s" $name) $port) }}
{{- $key := toString (int $port) }}
{{- if hasKey $seen $key }}
{{- fail (printf "ports.%s and ports.%s are both %s: the client, peer and HTTP listeners need a port each (ports.peer may equal ports.grpc: Raft then shares the client port)" (get $seen $key) $name $key) }}
{{- end }}
{{- $_ := set $seen $key $name }}
{{- end }}
{{- end }}

{{/*
Where the TLS certificates come from: "off" (tls.enabled false), "secret" (tls.secretName,
user-managed), "cert-manager" (the chart's Certificates), or "generated" (by Helm, in
secret-tls.yaml: a CA, the replicas' certificate with CN gangway:peers, an admin client
certificate).
*/}}
{{- define "gangway.tlsSource" -}}
{{- $cm := toString .Values.tls.certManager }}
{{- if not .Values.tls.enabled }}off
{{- else if .Values.tls.secretName }}secret
{{- else if or (eq $cm "true") (and (eq $cm "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1")) }}cert-manager
{{- else }}generated
{{- end }}
{{- end }}

{{/*
--tls-client-certs: "required" or "optional" (tls.clientCerts; auto: optional with
auth.mode kubernetes, where a bearer token identifies the client).
*/}}
{{- define "gangway.clientCerts" -}}
{{- $v := toString .Values.tls.clientCerts }}
{{- if eq $v "auto" }}
{{- if eq (include "gangway.authMode" .) "kubernetes" }}optional{{ else }}required{{ end }}
{{- else }}{{ $v }}
{{- end }}
{{- end }}

{{- define "gangway.validateTls" -}}
{{- $cm := toString .Values.tls.certManager }}
{{- if not (has $cm (list "auto" "true" "false")) }}
{{- fail (printf "tls.certManager must be auto, true or false, got %v" .Values.tls.certManager) }}
{{- end }}
{{- if not (has (toString .Values.tls.clientCerts) (list "auto" "required" "optional")) }}
{{- fail (printf "tls.clientCerts must be auto, required or optional, got %v" .Values.tls.clientCerts) }}
{{- end }}
{{- if and .Values.tls.issuerRef (not .Values.tls.issuerRef.name) }}
{{- fail "tls.issuerRef needs a name (and kind Issuer or ClusterIssuer; group defaults to cert-manager.io)" }}
{{- end }}
{{- include "gangway.requireInt" (list "tls.generatedDays" .Values.tls.generatedDays) }}
{{- if lt (int .Values.tls.generatedDays) 1 }}
{{- fail (printf "tls.generatedDays must be at least 1, got %v" .Values.tls.generatedDays) }}
{{- end }}
{{- end }}

{{/*
The Secret with the replicas' certificate and key, and the keys in it.
*/}}
{{- define "gangway.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "gangway.fullname" .)) .Values.tls.secretName }}
{{- end }}

{{- define "gangway.tlsCertKey" -}}
{{- if .Values.tls.secretName }}{{ .Values.tls.certKey }}{{ else }}tls.crt{{ end }}
{{- end }}

{{- define "gangway.tlsKeyKey" -}}
{{- if .Values.tls.secretName }}{{ .Values.tls.keyKey }}{{ else }}tls.key{{ end }}
{{- end }}

{{/*
The Secret with the CA that signs peer and client certificates, and its key.
*/}}
{{- define "gangway.tlsCASecretName" -}}
{{- default (include "gangway.tlsSecretName" .) .Values.tls.clientCA.secretName }}
{{- end }}

{{- define "gangway.tlsCAKey" -}}
{{- if or .Values.tls.clientCA.secretName .Values.tls.secretName }}{{ .Values.tls.clientCA.key }}{{ else }}ca.crt{{ end }}
{{- end }}

{{/*
cert-manager names: the CA Issuer, and the admin client Certificate (and its Secret).
*/}}
{{- define "gangway.caIssuerName" -}}
{{- printf "%s-ca" (include "gangway.fullname" .) }}
{{- end }}

{{- define "gangway.adminClientName" -}}
{{- printf "%s-admin-client" (include "gangway.fullname" .) }}
{{- end }}

{{/*
DNS names of the replicas' certificate: every replica's peer name (wildcard), the client
Service, localhost, and tls.extraDnsNames. YAML list.
*/}}
{{- define "gangway.tlsDnsNames" -}}
{{- $full := include "gangway.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $peers := include "gangway.peersService" . }}
{{- $domain := trimPrefix "." (toString (default "" .Values.cluster.clusterDomain)) }}
{{- $names := list (printf "*.%s.%s.svc" $peers $ns) }}
{{- if $domain }}
{{- $names = append $names (printf "*.%s.%s.svc.%s" $peers $ns $domain) }}
{{- end }}
{{- $names = concat $names (list $full (printf "%s.%s" $full $ns) (printf "%s.%s.svc" $full $ns)) }}
{{- if $domain }}
{{- $names = append $names (printf "%s.%s.svc.%s" $full $ns $domain) }}
{{- end }}
{{- $names = append $names "localhost" }}
{{- $names = concat $names (default list .Values.tls.extraDnsNames) }}
{{- toYaml (uniq $names) }}
{{- end }}

{{/*
Authorization: the mode, and whether a policy file is passed (mode policy, or mode
kubernetes with a policy given).
*/}}
{{- define "gangway.authMode" -}}
{{- toString .Values.auth.mode }}
{{- end }}

{{- define "gangway.policyEnabled" -}}
{{- $mode := include "gangway.authMode" . }}
{{- $given := or .Values.auth.policy.secretName .Values.auth.policy.inline }}
{{- if or (eq $mode "policy") (and (eq $mode "kubernetes") (or $given (include "gangway.adminInPolicy" .))) }}true{{ end }}
{{- end }}

{{/*
Whether the chart's policy names the admin client certificate (CN gangway-admin) as an
administrator: auth.mode kubernetes (where a certificate alone grants nothing otherwise),
auth.adminCertificate, TLS on, and no policy of the user's own Secret.
*/}}
{{- define "gangway.adminInPolicy" -}}
{{- if and (eq (include "gangway.authMode" .) "kubernetes") .Values.auth.adminCertificate (ne (include "gangway.tlsSource" .) "off") (not .Values.auth.policy.secretName) }}true{{ end }}
{{- end }}

{{/*
The policy identity of the admin client certificate.
*/}}
{{- define "gangway.adminIdentity" -}}
{{- toYaml (dict "name" "gangway-admin" "roles" (list "admin") "certificates" (list "gangway-admin")) }}
{{- end }}

{{/*
The identities of auth.policy.inline (a list; empty without one).
*/}}
{{- define "gangway.inlineIdentities" -}}
{{- $ids := list }}
{{- if .Values.auth.policy.inline }}
{{- $ids = default (list) (get (include "gangway.policyInline" . | fromYaml) "identities") }}
{{- end }}
{{- toYaml (dict "identities" $ids) }}
{{- end }}

{{/*
The text of the chart's policy Secret: auth.policy.inline as written, followed by the admin
certificate's identity when gangway.adminInPolicy (unless the inline policy names
certificate gangway-admin itself: then its entry decides).
*/}}
{{- define "gangway.policyDocument" -}}
{{- if not (include "gangway.adminInPolicy" .) }}
{{- include "gangway.policyInline" . }}
{{- else }}
{{- $ids := get (include "gangway.inlineIdentities" . | fromYaml) "identities" }}
{{- $named := false }}
{{- range $ids }}
{{- if and (kindIs "map" .) (has "gangway-admin" (default (list) .certificates)) }}{{ $named = true }}{{ end }}
{{- end }}
{{- if not $named }}
{{- $ids = append $ids (include "gangway.adminIdentity" . | fromYaml) }}
{{- end }}
{{- print "# auth.policy.inline, and the admin client certificate (auth.adminCertificate)\n" }}
{{- toYaml (dict "identities" $ids) }}
{{- end }}
{{- end }}

{{- define "gangway.policySecretName" -}}
{{- default (printf "%s-policy" (include "gangway.fullname" .)) .Values.auth.policy.secretName }}
{{- end }}

{{/*
The inline policy as YAML text (a string as it is, a map rendered).
*/}}
{{- define "gangway.policyInline" -}}
{{- $p := .Values.auth.policy.inline }}
{{- if kindIs "string" $p }}{{ $p }}{{ else }}{{ toYaml $p }}{{ end }}
{{- end }}

{{- define "gangway.validateAuth" -}}
{{- $mode := include "gangway.authMode" . }}
{{- if not (has $mode (list "kubernetes" "policy" "none")) }}
{{- fail (printf "auth.mode must be kubernetes, policy or none, got %v" .Values.auth.mode) }}
{{- end }}
{{- if and (eq $mode "kubernetes") (not .Values.scheduler.inCluster) }}
{{- fail "auth.mode kubernetes checks tokens and permissions with the Kubernetes API (TokenReview, SubjectAccessReview) through the in-cluster credentials, which scheduler.inCluster=false turns off: set scheduler.inCluster=true, or auth.mode=policy with an access policy" }}
{{- end }}
{{- $policy := .Values.auth.policy }}
{{- if and (eq $mode "policy") (not (or $policy.secretName $policy.inline)) }}
{{- fail "auth.mode policy needs the access policy: auth.policy.secretName (an existing Secret, key auth.policy.key) or auth.policy.inline (the policy YAML; see the chart README, \"Authorization\")" }}
{{- end }}
{{- if and $policy.secretName $policy.inline }}
{{- fail "auth.policy: set auth.policy.secretName or auth.policy.inline, not both" }}
{{- end }}
{{- if and $policy.inline (not $policy.secretName) }}
{{- $parsed := include "gangway.policyInline" . | fromYaml }}
{{- if hasKey $parsed "Error" }}
{{- fail (printf "auth.policy.inline is not YAML: %s" (get $parsed "Error")) }}
{{- end }}
{{- if not (kindIs "slice" (get $parsed "identities")) }}
{{- fail "auth.policy.inline: the policy needs a list `identities` (see the chart README, \"Authorization\")" }}
{{- end }}
{{- if include "gangway.adminInPolicy" . }}
{{- range (get $parsed "identities") }}
{{- if and (kindIs "map" .) (eq (toString .name) "gangway-admin") (not (has "gangway-admin" (default (list) .certificates))) }}
{{- fail "auth.policy.inline: identity gangway-admin is the chart's name for the admin client certificate (auth.adminCertificate): rename yours, list certificates: [gangway-admin] in it, or set auth.adminCertificate=false" }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if not (kindIs "slice" .Values.networkPolicy.clients) }}
{{- fail "networkPolicy.clients must be a list of NetworkPolicyPeers (an empty list: no other clients)" }}
{{- end }}
{{- if not (kindIs "slice" .Values.networkPolicy.http) }}
{{- fail "networkPolicy.http must be a list of NetworkPolicyPeers (an empty list: no other clients)" }}
{{- end }}
{{- end }}

{{/*
Name of a user ClusterRole: <namespace>-<fullname>-<role>.
*/}}
{{- define "gangway.userRoleName" -}}
{{- printf "%s-%s" (include "gangway.clusterRoleName" .ctx) .role }}
{{- end }}
