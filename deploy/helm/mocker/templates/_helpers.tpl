{{/* The chart's name, and the release's full name: 50 characters at most, so that "-prefill-pods" fits 63. */}}
{{- define "mocker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 50 | trimSuffix "-" }}
{{- end }}

{{- define "mocker.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else if contains (include "mocker.name" .) .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "mocker.name" .) | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "mocker.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Labels of one component; called with (dict "root" $ "component" NAME). */}}
{{- define "mocker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mocker.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "mocker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{ include "mocker.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{/* A flag's value as a variable's: a list as a comma list. */}}
{{- define "mocker.envValue" -}}
{{- if kindIs "slice" . }}{{ join "," . | quote }}{{ else }}{{ . | quote }}{{ end }}
{{- end }}

{{/*
The ports of an engine pod, as container ports or (service: true) Service ports: one HTTP port per worker,
and with KV events one PUB port (and replay port) per worker and rank. Called with
(dict "root" $ "workers" W "ranks" R "service" BOOL).
*/}}
{{- define "mocker.enginePorts" -}}
{{- $values := .root.Values }}
{{- $key := "containerPort" }}
{{- if .service }}{{ $key = "port" }}{{ end }}
{{- range $w := until (int .workers) }}
- name: {{ if eq $w 0 }}http{{ else }}{{ printf "http-%d" $w }}{{ end }}
  {{ $key }}: {{ add $values.port $w }}
  protocol: TCP
{{- end }}
{{- if $values.kvEvents.enabled }}
{{- range $i := until (int (mul .workers .ranks)) }}
- name: {{ printf "kv-%d" $i }}
  {{ $key }}: {{ add $values.kvEvents.port $i }}
  protocol: TCP
{{- if $values.kvEvents.replayPort }}
- name: {{ printf "kv-replay-%d" $i }}
  {{ $key }}: {{ add $values.kvEvents.replayPort $i }}
  protocol: TCP
{{- end }}
{{- end }}
{{- end }}
{{- end }}
