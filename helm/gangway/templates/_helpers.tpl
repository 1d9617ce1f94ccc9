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
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "tls.enabled needs tls.secretName: the Secret with the certificate (tls.certKey), key (tls.keyKey) and, unless tls.clientCA.secretName is set, the CA (tls.clientCA.key)" }}
{{- end }}
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
{{- end }}
{{- end }}

{{/*
Cluster-scoped RBAC objects carry the namespace too, so releases of the same name in two
namespaces do not collide.
*/}}
{{- define "gangway.clusterRoleName" -}}
{{- printf "%s-%s" .Release.Namespace (include "gangway.fullname" .) }}
{{- end }}
