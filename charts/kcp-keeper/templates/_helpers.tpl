{{/*
The agents the chart can run: values key -> agent name. The object names are fixed (`kcp-keeper-<agent>`), not
derived from the release name, because they are the names each agent's `rbac` one-shot renders (its Role, its
Lease): one release of this chart per cluster.
*/}}
{{- define "kcp-keeper.agents" -}}
caSyncer: ca-syncer
dnsRewriter: dns-rewriter
kubeconfigRotator: kubeconfig-rotator
etcdSnapshotter: etcd-snapshotter
{{- end }}

{{/* An agent's image: its repository (else `<image.registry>/<agent>`, as `cargo xtask images` names it) and
the tag the agent sets, else `image.tag`, else appVersion (lockstep). */}}
{{- define "kcp-keeper.image" -}}
{{- $v := index .root.Values .key -}}
{{ $v.image.repository | default (printf "%s/%s" .root.Values.image.registry .agent) }}:{{ $v.image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end }}

{{- define "kcp-keeper.chart" -}}
{{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on everything; `agent` is the agent's name. Selector labels never change across upgrades. */}}
{{- define "kcp-keeper.labels" -}}
{{ include "kcp-keeper.selectorLabels" . }}
app.kubernetes.io/part-of: kcp-keeper
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ include "kcp-keeper.chart" .root }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "kcp-keeper.selectorLabels" -}}
app.kubernetes.io/name: {{ .agent }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end }}

{{/* Object name of an agent's ServiceAccount, Role, Lease, ConfigMap, Deployment. */}}
{{- define "kcp-keeper.name" -}}
kcp-keeper-{{ .agent }}
{{- end }}

{{- define "kcp-keeper.replicas" -}}
{{- $v := index .root.Values .key -}}
{{- if kindIs "invalid" $v.replicas }}{{ .root.Values.replicas }}{{ else }}{{ $v.replicas }}{{ end -}}
{{- end }}

{{/* An agent pod's terminationGracePeriodSeconds: longer than its drain after SIGTERM, so the kubelet's SIGKILL
never cuts the drain short. Every agent ends with the lease release, bounded by the renew deadline plus 1 s (11 s
with the defaults). etcd-snapshotter first lets a snapshot in flight finish (the runtime's Grace::finish, 15 s),
else aborts its multipart upload (Grace::abort, 8 s), then records the failure and releases the shard's lock:
15 + 8 + 11 = 34 s plus those writes, so 45. The others stop at once: Kubernetes' default 30 covers them. The node
test compares the live Deployments with the runtime's own numbers. */}}
{{- define "kcp-keeper.terminationGracePeriodSeconds" -}}
{{- if eq .key "etcdSnapshotter" }}45{{ else }}30{{ end -}}
{{- end }}

{{/* Every agent's and the doctor's probes, on the admin port. A restart stops the snapshot, drill or rotation in
flight, so only a process that does not answer for a minute is restarted: /livez answers at once from any live
process, but on a starved node (a drill's kcp starting beside other work) an answer can take seconds, and a 1 s
timeout restarted every agent at once. Readiness waits as long: a slow answer is not an unready agent (the doctor is
ready after its first run). */}}
{{- define "kcp-keeper.probes" -}}
livenessProbe:
  httpGet:
    path: /livez
    port: admin
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
readinessProbe:
  httpGet:
    path: /readyz
    port: admin
  periodSeconds: 5
  timeoutSeconds: 5
{{- end }}

{{/* Whether monitoring.coreos.com/v1 resources render: the API exists, or `force`. */}}
{{- define "kcp-keeper.monitoringAPI" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end -}}
{{- end }}

{{/* One RBAC rule; .names empty means every object of the resource. */}}
{{- define "kcp-keeper.rule" -}}
- apiGroups:
  - {{ .group | quote }}
  {{- with .names }}
  resourceNames:
  {{- range . }}
  - {{ . | quote }}
  {{- end }}
  {{- end }}
  resources:
  {{- range .resources }}
  - {{ . }}
  {{- end }}
  verbs:
  {{- range .verbs }}
  - {{ . }}
  {{- end }}
{{- end }}

{{/* A Role (or ClusterRole when .namespace is empty) named .name with .rules, bound to ServiceAccount .sa
(default: .name). */}}
{{- define "kcp-keeper.role" -}}
{{- $cluster := not .namespace }}
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ if $cluster }}ClusterRole{{ else }}Role{{ end }}
metadata:
  name: {{ .name }}
  {{- with .namespace }}
  namespace: {{ . }}
  {{- end }}
  labels:
    {{- include "kcp-keeper.labels" .ctx | nindent 4 }}
rules:
{{ .rules }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ if $cluster }}ClusterRoleBinding{{ else }}RoleBinding{{ end }}
metadata:
  name: {{ .name }}
  {{- with .namespace }}
  namespace: {{ . }}
  {{- end }}
  labels:
    {{- include "kcp-keeper.labels" .ctx | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: {{ if $cluster }}ClusterRole{{ else }}Role{{ end }}
  name: {{ .name }}
subjects:
- kind: ServiceAccount
  name: {{ .sa | default .name }}
  namespace: {{ .ctx.root.Release.Namespace }}
{{- end }}

{{- /*
The ConfigMap dns-rewriter manages, as JSON {"namespace", "name"}: in corefile mode the Corefile ConfigMap
(default kube-system/coredns), in k3s mode the import ConfigMap (default kube-system/coredns-custom); the
defaults are dns-rewriter's own (agents/dns-rewriter/src/config.rs).
*/}}
{{- define "kcp-keeper.dnsRewriterTarget" -}}
{{- $c := .Values.dnsRewriter.config }}
{{- if eq $c.mode "corefile" }}
{{- $t := $c.corefile | default dict }}
{{- dict "namespace" ($t.namespace | default "kube-system") "name" ($t.name | default "coredns") | toJson }}
{{- else }}
{{- $t := $c.k3s | default dict }}
{{- dict "namespace" ($t.namespace | default "kube-system") "name" ($t.name | default "coredns-custom") | toJson }}
{{- end }}
{{- end }}
