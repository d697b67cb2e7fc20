{{/* Names, labels and shared snippets. */}}

{{- define "rollmux.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rollmux.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Selector labels of one component: pass (dict "ctx" $ "component" "coordinator"). */}}
{{- define "rollmux.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rollmux.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "rollmux.labels" -}}
{{ include "rollmux.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "rollmux.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "rollmux.secretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "rollmux.fullname" .)) -}}
{{- end -}}

{{- define "rollmux.tlsSecretName" -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "rollmux.fullname" .)) -}}
{{- end -}}

{{- define "rollmux.coordinatorService" -}}
{{- printf "%s-coordinator" (include "rollmux.fullname" .) -}}
{{- end -}}

{{- define "rollmux.coordinatorAddress" -}}
{{- printf "%s.%s.svc:%v" (include "rollmux.coordinatorService" .) .Release.Namespace .Values.coordinator.ports.grpc -}}
{{- end -}}

{{- define "rollmux.redisName" -}}
{{- printf "%s-redis" (include "rollmux.fullname" .) -}}
{{- end -}}

{{- define "rollmux.timeSlicingName" -}}
{{- .Values.timeSlicing.configMapName | default (printf "%s-time-slicing" (include "rollmux.fullname" .)) -}}
{{- end -}}

{{/* Pod security context shared by every RollMux pod: non-root, RuntimeDefault seccomp. */}}
{{- define "rollmux.podSecurity" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .gid }}
fsGroup: {{ .gid }}
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container security context: read-only root, no privilege escalation, no capabilities. */}}
{{- define "rollmux.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}
