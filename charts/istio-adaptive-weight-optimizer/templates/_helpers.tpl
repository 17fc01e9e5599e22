{{/* Every object is <fullname>-<part>; fullname is the release name. */}}
{{- define "iawo.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "iawo.selectorLabels" -}}
control-plane: controller-manager
app.kubernetes.io/name: istio-adaptive-least-request
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "iawo.labels" -}}
{{ include "iawo.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "iawo.serviceAccountName" -}}
{{- default (printf "%s-controller-manager" (include "iawo.fullname" .)) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "iawo.metricsServiceName" -}}
{{- printf "%s-controller-manager-metrics-service" (include "iawo.fullname" .) -}}
{{- end -}}

{{- define "iawo.image" -}}
{{- $tag := toString (default .Chart.AppVersion .Values.image.tag) -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the metrics endpoint's certificate, or "" for none. */}}
{{- define "iawo.metricsCertSecret" -}}
{{- if .Values.metrics.certificate.certManager.enabled -}}
{{- printf "%s-metrics-cert" (include "iawo.fullname" .) -}}
{{- else -}}
{{- .Values.metrics.certificate.secretName -}}
{{- end -}}
{{- end -}}

{{- define "iawo.serviceMonitorNamespace" -}}
{{- default .Release.Namespace .Values.serviceMonitor.namespace -}}
{{- end -}}

{{/* The service account whose token the ServiceMonitor sends. */}}
{{- define "iawo.scraperServiceAccount" -}}
{{- default (printf "%s-metrics-scraper" (include "iawo.fullname" .)) .Values.serviceMonitor.serviceAccountName -}}
{{- end -}}
