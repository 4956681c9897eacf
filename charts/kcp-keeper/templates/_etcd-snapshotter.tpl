{{- /*
etcd-snapshotter's pod needs more than the other agents: the S3 keys from a Secret the values only name (never
the keys themselves), optionally the etcd client certificates and an age identity (for drills and restores of
encrypted snapshots), a disk for parts S3 is slow to take (the spill directory), and a disk of its own for
restore drills (each downloads and restores a whole database), so a drill can never fill the snapshot's volume.
*/}}

{{/* Where the chart mounts the S3 credentials Secret; the configuration's secretDirectory must say this. */}}
{{- define "kcp-keeper.snapshotter.s3Dir" -}}/var/run/secrets/etcd-snapshotter/s3{{- end }}
{{- define "kcp-keeper.snapshotter.s3SecondaryDir" -}}/var/run/secrets/etcd-snapshotter/s3-secondary{{- end }}
{{- define "kcp-keeper.snapshotter.ageDir" -}}/var/run/secrets/etcd-snapshotter/age{{- end }}
{{- define "kcp-keeper.snapshotter.deltaKeyDir" -}}/var/run/secrets/etcd-snapshotter/delta-key{{- end }}
{{- define "kcp-keeper.snapshotter.tlsDir" -}}/etc/etcd-tls{{- end }}
{{/* Where drills run: config.drills.directory, or the agent's default <spill.directory>/drills (then the drills
volume is mounted inside the spill volume's path, still a volume of its own). */}}
{{- define "kcp-keeper.snapshotter.drillsDir" -}}
{{- $v := .Values.etcdSnapshotter -}}
{{- dig "drills" "directory" (printf "%s/drills" (dig "spill" "directory" "" $v.config)) $v.config -}}
{{- end }}

{{/* Fails the render on values that would give the agent credentials it cannot read. */}}
{{- define "kcp-keeper.snapshotter.check" -}}
{{- $v := .Values.etcdSnapshotter -}}
{{- if not (dig "spill" "directory" "" $v.config) }}
{{- fail "etcdSnapshotter.config.spill.directory: required (the chart mounts an emptyDir there)" }}
{{- end }}
{{- if eq (include "kcp-keeper.snapshotter.drillsDir" .) $v.config.spill.directory }}
{{- fail "etcdSnapshotter.config.drills.directory: must not be spill.directory (drills get a volume of their own, drillsSizeLimit)" }}
{{- end }}
{{- $creds := dig "storage" "credentials" dict $v.config }}
{{- $secret := $v.s3Credentials.existingSecret }}
{{- if hasKey $creds "secretDirectory" }}
{{- if not $secret }}
{{- fail "etcdSnapshotter.s3Credentials.existingSecret: name the Secret holding AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (config.storage.credentials.secretDirectory reads it)" }}
{{- end }}
{{- if ne $creds.secretDirectory (include "kcp-keeper.snapshotter.s3Dir" .) }}
{{- fail (printf "etcdSnapshotter.config.storage.credentials.secretDirectory: must be %s, where the chart mounts s3Credentials.existingSecret" (include "kcp-keeper.snapshotter.s3Dir" .)) }}
{{- end }}
{{- else if hasKey $creds "environment" }}
{{- if not $secret }}
{{- fail "etcdSnapshotter.s3Credentials.existingSecret: name the Secret holding AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (config.storage.credentials.environment reads them from the environment)" }}
{{- end }}
{{- end }}
{{- $second := dig "secondary" "storage" "credentials" "secretDirectory" "" $v.config }}
{{- $secondDir := include "kcp-keeper.snapshotter.s3SecondaryDir" . }}
{{- if and $second (ne $second $secondDir) }}
{{- fail (printf "etcdSnapshotter.config.secondary.storage.credentials.secretDirectory: must be %s, where the chart mounts secondaryS3Credentials.existingSecret" $secondDir) }}
{{- end }}
{{- if and $second (not $v.secondaryS3Credentials.existingSecret) }}
{{- fail "etcdSnapshotter.secondaryS3Credentials.existingSecret: name the Secret holding the second store's AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (config.secondary.storage.credentials.secretDirectory reads it)" }}
{{- end }}
{{- if and $v.secondaryS3Credentials.existingSecret (not $second) }}
{{- fail (printf "etcdSnapshotter.config.secondary.storage.credentials.secretDirectory: must be %s to read secondaryS3Credentials.existingSecret" $secondDir) }}
{{- end }}
{{- $identity := dig "drills" "identityFile" "" $v.config }}
{{- $mounted := printf "%s/identity.txt" (include "kcp-keeper.snapshotter.ageDir" .) }}
{{- if and $v.ageIdentity.existingSecret (ne $identity $mounted) }}
{{- fail (printf "etcdSnapshotter.config.drills.identityFile: must be %s, where the chart mounts ageIdentity.existingSecret" $mounted) }}
{{- end }}
{{- if and (eq $identity $mounted) (not $v.ageIdentity.existingSecret) }}
{{- fail "etcdSnapshotter.ageIdentity.existingSecret: name the Secret holding the age identity (config.drills.identityFile reads it)" }}
{{- end }}
{{- $deltaKey := dig "deltaSigningKeyFile" "" $v.config }}
{{- $deltaKeyMounted := printf "%s/key" (include "kcp-keeper.snapshotter.deltaKeyDir" .) }}
{{- if and $v.deltaSigningKey.existingSecret (ne $deltaKey $deltaKeyMounted) }}
{{- fail (printf "etcdSnapshotter.config.deltaSigningKeyFile: must be %s, where the chart mounts deltaSigningKey.existingSecret" $deltaKeyMounted) }}
{{- end }}
{{- if and (eq $deltaKey $deltaKeyMounted) (not $v.deltaSigningKey.existingSecret) }}
{{- fail "etcdSnapshotter.deltaSigningKey.existingSecret: name the Secret holding the delta signing key (config.deltaSigningKeyFile reads it)" }}
{{- end }}
{{- end }}

{{- define "kcp-keeper.snapshotter.env" -}}
# The SDK must never probe a cloud metadata endpoint: the credentials are always given explicitly.
- name: AWS_EC2_METADATA_DISABLED
  value: "true"
{{- $v := .Values.etcdSnapshotter -}}
{{- if hasKey (dig "storage" "credentials" dict $v.config) "environment" }}
{{- range $k := list "AWS_ACCESS_KEY_ID" "AWS_SECRET_ACCESS_KEY" }}
- name: {{ $k }}
  valueFrom:
    secretKeyRef:
      name: {{ $v.s3Credentials.existingSecret }}
      key: {{ $k }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kcp-keeper.snapshotter.mounts" -}}
{{- $v := .Values.etcdSnapshotter -}}
- name: spill
  mountPath: {{ $v.config.spill.directory }}
- name: drills
  mountPath: {{ include "kcp-keeper.snapshotter.drillsDir" . }}
{{- if hasKey (dig "storage" "credentials" dict $v.config) "secretDirectory" }}
- name: s3-credentials
  mountPath: {{ include "kcp-keeper.snapshotter.s3Dir" . }}
  readOnly: true
{{- end }}
{{- if $v.secondaryS3Credentials.existingSecret }}
- name: s3-secondary-credentials
  mountPath: {{ include "kcp-keeper.snapshotter.s3SecondaryDir" . }}
  readOnly: true
{{- end }}
{{- if $v.etcdClientTLS.existingSecret }}
- name: etcd-tls
  mountPath: {{ include "kcp-keeper.snapshotter.tlsDir" . }}
  readOnly: true
{{- end }}
{{- if $v.ageIdentity.existingSecret }}
- name: age-identity
  mountPath: {{ include "kcp-keeper.snapshotter.ageDir" . }}
  readOnly: true
{{- end }}
{{- if $v.deltaSigningKey.existingSecret }}
- name: delta-signing-key
  mountPath: {{ include "kcp-keeper.snapshotter.deltaKeyDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "kcp-keeper.snapshotter.volumes" -}}
{{- $v := .Values.etcdSnapshotter -}}
# Parts S3 is slow to take wait here (bounded by spill.memoryBudget in memory first).
- name: spill
  emptyDir:
    sizeLimit: {{ $v.spillSizeLimit }}
# Restore drills download, decode and restore a whole database here: apart from the spill volume, so a drill
# never takes the room a snapshot in flight needs (nor gets the pod evicted mid-snapshot).
- name: drills
  emptyDir:
    sizeLimit: {{ $v.drillsSizeLimit }}
{{- if hasKey (dig "storage" "credentials" dict $v.config) "secretDirectory" }}
- name: s3-credentials
  secret:
    secretName: {{ $v.s3Credentials.existingSecret }}
    defaultMode: 0440  # group-readable: the pod's fsGroup
    items:
    - {key: AWS_ACCESS_KEY_ID, path: AWS_ACCESS_KEY_ID}
    - {key: AWS_SECRET_ACCESS_KEY, path: AWS_SECRET_ACCESS_KEY}
{{- end }}
{{- if $v.secondaryS3Credentials.existingSecret }}
- name: s3-secondary-credentials
  secret:
    secretName: {{ $v.secondaryS3Credentials.existingSecret }}
    defaultMode: 0440  # group-readable: the pod's fsGroup
    items:
    - {key: AWS_ACCESS_KEY_ID, path: AWS_ACCESS_KEY_ID}
    - {key: AWS_SECRET_ACCESS_KEY, path: AWS_SECRET_ACCESS_KEY}
{{- end }}
{{- if $v.etcdClientTLS.existingSecret }}
- name: etcd-tls
  secret:
    secretName: {{ $v.etcdClientTLS.existingSecret }}
    defaultMode: 0440  # group-readable: the pod's fsGroup
{{- end }}
{{- if $v.ageIdentity.existingSecret }}
- name: age-identity
  secret:
    secretName: {{ $v.ageIdentity.existingSecret }}
    defaultMode: 0440  # group-readable: the pod's fsGroup
    items:
    - {key: {{ $v.ageIdentity.key }}, path: identity.txt}
{{- end }}
{{- if $v.deltaSigningKey.existingSecret }}
- name: delta-signing-key
  secret:
    secretName: {{ $v.deltaSigningKey.existingSecret }}
    defaultMode: 0440  # group-readable: the pod's fsGroup
    items:
    - {key: {{ $v.deltaSigningKey.key }}, path: key}
{{- end }}
{{- end }}
