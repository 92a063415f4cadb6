{{/* Name of the release's objects. */}}
{{- define "ebb.fullname" -}}
{{- if contains "ebb" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-ebb" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "ebb.labels" -}}
app.kubernetes.io/name: ebb
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of a component (controller or node-agent). */}}
{{- define "ebb.selector" -}}
app.kubernetes.io/name: ebb
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Image reference of a component. */}}
{{- define "ebb.image" -}}
{{- printf "%s/%s:%s" .root.Values.image.registry .name (default .root.Chart.AppVersion .root.Values.image.tag) -}}
{{- end -}}

{{/* Security context shared by both containers. */}}
{{- define "ebb.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
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
