{{/* Object name prefix, DNS-safe (63 characters). */}}
{{- define "ardiff.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object of the release. `app.kubernetes.io/name: ardiff` is fixed (docs/contracts.md §1). */}}
{{- define "ardiff.labels" -}}
app.kubernetes.io/name: ardiff
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Selector labels of one component; call with (dict "root" $ "component" "operator"). */}}
{{- define "ardiff.selectorLabels" -}}
app.kubernetes.io/name: ardiff
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The worker pods the operator creates carry these labels (docs/contracts.md §1), whatever the release. */}}
{{- define "ardiff.workerSelectorLabels" -}}
app.kubernetes.io/name: ardiff
app.kubernetes.io/component: worker
{{- end -}}

{{- define "ardiff.operatorName" -}}
{{- printf "%s-operator" (include "ardiff.fullname" .) -}}
{{- end -}}

{{- define "ardiff.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (include "ardiff.operatorName" .) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "ardiff.peeringName" -}}
{{- default (include "ardiff.fullname" .) .Values.operator.peering.name -}}
{{- end -}}

{{/*
Namespaces that hold worker pools, as a JSON list: the watched namespaces (default: the release namespace).
In cluster-wide mode the namespaced companions (peering, NetworkPolicy, PDB) go to the release namespace.
*/}}
{{- define "ardiff.workerNamespaces" -}}
{{- if and .Values.clusterWide .Values.operator.watchNamespaces -}}
{{- fail "operator.watchNamespaces must be empty when clusterWide is true: cluster-wide mode watches every namespace" -}}
{{- end -}}
{{- if .Values.operator.watchNamespaces -}}
{{- .Values.operator.watchNamespaces | uniq | toJson -}}
{{- else -}}
{{- list .Release.Namespace | toJson -}}
{{- end -}}
{{- end -}}

{{- define "ardiff.redisName" -}}
{{- printf "%s-redis" (include "ardiff.fullname" .) -}}
{{- end -}}

{{/* The Secret and key that hold the Redis URL the operator and the workers use. */}}
{{- define "ardiff.redisUrlSecretName" -}}
{{- if and (eq .Values.redis.mode "external") .Values.redis.external.existingSecret -}}
{{- .Values.redis.external.existingSecret -}}
{{- else -}}
{{- include "ardiff.redisName" . -}}
{{- end -}}
{{- end -}}

{{- define "ardiff.redisUrlSecretKey" -}}
{{- if and (eq .Values.redis.mode "external") .Values.redis.external.existingSecret -}}
{{- .Values.redis.external.existingSecretKey -}}
{{- else -}}
url
{{- end -}}
{{- end -}}

{{/*
The user's Secret holding the bundled Redis password (redis.bundled.auth.existingSecret), or "" when the chart
keeps it. With one, nothing renders the password: repeatable renders, no `lookup`, no random value.
*/}}
{{- define "ardiff.redisAuthSecret" -}}
{{- if and (eq .Values.redis.mode "bundled") .Values.redis.bundled.auth.existingSecret -}}
{{- if .Values.redis.bundled.password -}}
{{- fail "redis.bundled.password and redis.bundled.auth.existingSecret are exclusive: keep the password in the Secret" -}}
{{- end -}}
{{- .Values.redis.bundled.auth.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* The Secret and key the bundled Redis password is read from (the user's, else this release's). */}}
{{- define "ardiff.redisPasswordSecretRef" -}}
{{- $existing := include "ardiff.redisAuthSecret" . -}}
name: {{ default (include "ardiff.redisName" .) $existing }}
key: {{ ternary .Values.redis.bundled.auth.existingSecretPasswordKey "password" (ne $existing "") }}
{{- end -}}

{{/*
The bundled Redis' users (issue 23 item 1, docs/contracts.md §10): the operator's own, with every pool's keys,
everything but the dangerous commands, and the ACL subcommands it makes each pool's workers' user with (the
operator's kv/acl.py OPERATOR_USERNAME and OPERATOR_RULES; a test checks they agree); `default` is off.
*/}}
{{- define "ardiff.redisOperatorUser" -}}
{{- print "ardiff-operator" -}}
{{- end -}}

{{- define "ardiff.redisOperatorRules" -}}
{{- print "~{ardiff:*}:* resetchannels +@all -@dangerous +acl|setuser +acl|deluser +acl|getuser +acl|users +acl|save" -}}
{{- end -}}

{{/* `user` lines of redis.conf: `default` off, the operator's user with `password` (e.g. `>pw`, `#sha256`). */}}
{{- define "ardiff.redisUsers" -}}
user default off resetchannels -@all
user {{ include "ardiff.redisOperatorUser" .root }} on {{ .password }} {{ include "ardiff.redisOperatorRules" .root }}
{{- end -}}

{{/*
The bundled Redis' URL for the operator's user with `password`: rediss:// naming the CA's mount in the operator's
Pod when redis.bundled.tls.secretName is set (issue 23 item 9), else redis://.
*/}}
{{- define "ardiff.bundledRedisUrl" -}}
{{- $tls := .root.Values.redis.bundled.tls.secretName -}}
{{- $host := printf "%s.%s.svc" (include "ardiff.redisName" .root) .root.Release.Namespace -}}
{{- printf "%s://%s:%s@%s:6379/0" (ternary "rediss" "redis" (ne $tls "")) (include "ardiff.redisOperatorUser" .root) .password $host -}}
{{- if $tls }}?ssl_ca_certs=/etc/ardiff/redis-tls/ca.crt{{ end -}}
{{- end -}}

{{/*
The Secret and its items the operator mounts at /etc/ardiff/redis-tls (the CA of a TLS Redis), as a volume's
`secret`; empty without one: the bundled Redis' TLS Secret (ca.crt only: not its key), or redis.external.tls.caSecret.
*/}}
{{- define "ardiff.redisCaVolume" -}}
{{- if and (eq .Values.redis.mode "bundled") .Values.redis.bundled.tls.secretName }}
secretName: {{ .Values.redis.bundled.tls.secretName }}
items:
  - key: ca.crt
    path: ca.crt
{{- else if and (eq .Values.redis.mode "external") .Values.redis.external.tls.caSecret }}
secretName: {{ .Values.redis.external.tls.caSecret }}
{{- end }}
{{- end -}}

{{/*
ARDIFF_REDIS_URL and ARDIFF_WORKER_REDIS_URL of the operator: from the URL Secret, or, when the bundled Redis
password is in the user's Secret, composed by the kubelet from it ($(VAR) expansion: no password in the spec).
*/}}
{{- define "ardiff.redisUrlEnv" -}}
{{- if include "ardiff.redisAuthSecret" . }}
- name: ARDIFF_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      {{- include "ardiff.redisPasswordSecretRef" . | nindent 6 }}
{{- $url := include "ardiff.bundledRedisUrl" (dict "root" . "password" "$(ARDIFF_REDIS_PASSWORD)") }}
- name: ARDIFF_REDIS_URL
  value: {{ $url | quote }}
- name: ARDIFF_WORKER_REDIS_URL
  value: {{ $url | quote }}
{{- else }}
{{- range $name := list "ARDIFF_REDIS_URL" "ARDIFF_WORKER_REDIS_URL" }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ include "ardiff.redisUrlSecretName" $ }}
      key: {{ include "ardiff.redisUrlSecretKey" $ }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A Pod's pull Secrets: the lists given (the component's own, then the chart-wide ones), without repeats. */}}
{{- define "ardiff.imagePullSecrets" -}}
{{- $secrets := list -}}
{{- range . }}
{{- $secrets = concat $secrets (default list .) -}}
{{- end }}
{{- $secrets = uniq $secrets -}}
{{- with $secrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The bundled Redis password: the value, else the one already in the cluster, else a new random one. */}}
{{- define "ardiff.redisPassword" -}}
{{- if .Values.redis.bundled.password -}}
{{- .Values.redis.bundled.password -}}
{{- else -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "ardiff.redisName" .) -}}
{{- if and $existing (index $existing.data "password") -}}
{{- index $existing.data "password" | b64dec -}}
{{- else -}}
{{- randAlphaNum 40 -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ardiff.operatorImage" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) -}}
{{- end -}}

{{- define "ardiff.workerImage" -}}
{{- printf "%s:%s" .Values.worker.image.repository (default .Chart.AppVersion .Values.worker.image.tag) -}}
{{- end -}}

{{- define "ardiff.gatewayName" -}}
{{- printf "%s-gateway" (include "ardiff.fullname" .) -}}
{{- end -}}

{{- define "ardiff.gatewayImage" -}}
{{- printf "%s:%s" .Values.gateway.image.repository (default .Chart.AppVersion .Values.gateway.image.tag) -}}
{{- end -}}

{{/* The Secret the operator keeps with the gateway's own Redis user (`url`, its CA `ca.crt`). */}}
{{- define "ardiff.gatewayRedisSecret" -}}
{{- printf "%s-gateway-redis" (include "ardiff.fullname" .) -}}
{{- end -}}

{{/* The picker's Service: its gRPC port (a GIE gateway's endpointPickerRef) and both containers' metrics. */}}
{{- define "ardiff.pickerName" -}}
{{- printf "%s-picker" (include "ardiff.fullname" .) -}}
{{- end -}}

{{/* The pools routed by a cluster's own GIE gateway, as a JSON list (default: the default pool). */}}
{{- define "ardiff.inferencePools" -}}
{{- if .Values.gateway.inferenceExtension.pools -}}
{{- .Values.gateway.inferenceExtension.pools | uniq | toJson -}}
{{- else if .Values.defaultPool.enabled -}}
{{- list .Values.defaultPool.name | toJson -}}
{{- else -}}
{{- list | toJson -}}
{{- end -}}
{{- end -}}
