{{/* Name of the chart's objects, within 63 characters. */}}
{{- define "tailtune.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tailtune.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The operator's pods. `component` keeps them apart from the Triton pods, which share name=tailtune. */}}
{{- define "tailtune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tailtune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "tailtune.labels" -}}
{{ include "tailtune.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "tailtune.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tailtune.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tailtune.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Rules the operator needs in every namespace it serves (a ClusterRole, or a Role per namespace). */}}
{{- define "tailtune.namespacedRules" -}}
# InferenceServices: kopf lists and watches them and keeps its progress in annotations (patch); handlers read one.
- apiGroups: [tailtune.io]
  resources: [inferenceservices]
  verbs: [get, list, watch, patch]
# Status is written once per reconcile, as a merge patch of the status subresource.
- apiGroups: [tailtune.io]
  resources: [inferenceservices/status]
  verbs: [get, patch]
# Children are written by server-side apply (PATCH, which creates when absent: create is checked too).
# Jobs and Deployments are also read and watched (kopf handlers on children).
# delete on Jobs only: once the engine a spec asks for is built, the build Jobs of keys no longer in force
# (running or done) are deleted, so an obsolete build stops holding a GPU and old Jobs do not pile up; the
# Job of the key in force is kept (its name is the cache key: a finished one is a cache hit). Nothing else is
# ever deleted by the operator: the rest goes with its owner through the garbage collector.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch]
# The ConfigMap and Service are watched (list/watch, by our managed-by label) so a hand edit or deletion is
# repaired within seconds of its event, not at the next resync; they are never read one by one (no get).
- apiGroups: [""]
  resources: [configmaps, services]
  verbs: [list, watch, create, patch]
# Pods of the build Job and of Triton: termination messages, readiness, unschedulable reasons, IPs.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# Events on InferenceServices (ours and kopf's); read back for a build Job's FailedCreate and `tailtune explain`.
- apiGroups: [""]
  resources: [events]
  verbs: [create, list]
{{- end }}

{{/* Namespaces that get an engine-store PVC, as a JSON list: engineStore.namespaces, else the watched namespaces,
else the release namespace. */}}
{{- define "tailtune.engineStoreNamespaces" -}}
{{- $ns := .Values.engineStore.namespaces | default .Values.watchNamespaces | default (list .Release.Namespace) -}}
{{- toJson $ns -}}
{{- end }}

{{/* The claim InferenceServices name in spec.engine.store.pvc. */}}
{{- define "tailtune.engineStoreClaim" -}}
{{- .Values.engineStore.existingClaim | default .Values.engineStore.name -}}
{{- end }}
