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
