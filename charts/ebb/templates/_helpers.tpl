{{/* Name of the chart (nameOverride replaces it in names and the app.kubernetes.io/name label). */}}
{{- define "ebb.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of the release's objects: fullnameOverride, else the release name when it already
     contains the chart's name, else <release>-<name>. */}}
{{- define "ebb.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "ebb.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "ebb.labels" -}}
app.kubernetes.io/name: {{ include "ebb.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.additionalLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of a component (controller or node-agent). */}}
{{- define "ebb.selector" -}}
app.kubernetes.io/name: {{ include "ebb.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Image reference of a component (.image: its repository, tag and digest): the repository
     defaults to <image.registry>/<default name>, the tag to image.tag and then to the chart's
     appVersion; a digest wins over the tag (repository@sha256:...). */}}
{{- define "ebb.image" -}}
{{- $repo := default (printf "%s/%s" .root.Values.image.registry .name) .image.repository -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (.image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* ServiceAccount of the controller: serviceAccount.name, else <fullname>-controller. */}}
{{- define "ebb.controller.serviceAccountName" -}}
{{- default (printf "%s-controller" (include "ebb.fullname" .)) .Values.controller.serviceAccount.name -}}
{{- end -}}

{{/* ServiceAccount of the node agent: serviceAccount.name, else <fullname>-node-agent. */}}
{{- define "ebb.nodeAgent.serviceAccountName" -}}
{{- default (printf "%s-node-agent" (include "ebb.fullname" .)) .Values.nodeAgent.serviceAccount.name -}}
{{- end -}}

{{/* Pod-template metadata of a component: the chart's labels, the component, podLabels and
     podAnnotations (.values: the component's values). */}}
{{- define "ebb.podMetadata" -}}
labels:
  {{- include "ebb.labels" .root | nindent 2 }}
  app.kubernetes.io/component: {{ .component }}
  {{- with .values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* OpenTelemetry environment of the controller and the node agent (each binary sets its service name). */}}
{{- define "ebb.otelEnv" -}}
{{- if .Values.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.otel.endpoint | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ include "ebb.otelAttributes" . | quote }}
{{- end }}
{{- end -}}

{{- define "ebb.otelAttributes" -}}
{{- $attrs := list (printf "service.namespace=%s" .Release.Namespace) (printf "service.version=%s" .Chart.AppVersion) -}}
{{- range $k, $v := .Values.otel.resourceAttributes -}}
{{- $attrs = append $attrs (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $attrs -}}
{{- end -}}

{{/* Name of the controller's leader-election Lease. */}}
{{- define "ebb.leaseName" -}}
{{- include "ebb.fullname" . }}-controller
{{- end -}}

{{/*
The steering webhook configuration's annotations: with cert-manager, its CA injector keeps
caBundle (the controller never writes it then).
*/}}
{{- define "ebb.steering.annotations" -}}
{{- if .Values.steering.certManager.enabled -}}
annotations:
  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/{{ include "ebb.fullname" . }}-steering
{{- end }}
{{- end }}
