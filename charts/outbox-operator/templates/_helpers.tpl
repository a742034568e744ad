{{/*
The chart's name, or nameOverride.
*/}}
{{- define "outbox-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects: fullnameOverride, else the release
name, followed by the chart's name unless the release name holds it.
*/}}
{{- define "outbox-operator.fullname" -}}
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

{{/*
chart-version, as in the helm.sh/chart label.
*/}}
{{- define "outbox-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object.
*/}}
{{- define "outbox-operator.labels" -}}
helm.sh/chart: {{ include "outbox-operator.chart" . }}
app.kubernetes.io/name: {{ include "outbox-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Labels of the manager's Deployment, pods and metrics Service.
*/}}
{{- define "outbox-operator.managerLabels" -}}
{{ include "outbox-operator.labels" . }}
app.kubernetes.io/component: controller-manager
{{- end }}

{{/*
Labels that select the manager's pods (and its metrics Service). They differ
from the labels of the relay pods (app.kubernetes.io/name: outbox-relay).
*/}}
{{- define "outbox-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outbox-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller-manager
{{- end }}

{{/*
The manager's ServiceAccount.
*/}}
{{- define "outbox-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "outbox-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The operator's image: repository@digest, else repository:tag (tag defaults to
the chart's appVersion).
*/}}
{{- define "outbox-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}
