{{/* Names, labels and the operator command line shared by every template. */}}

{{- define "pd-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pd-operator.fullname" -}}
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

{{- define "pd-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pd-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pd-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pd-operator.labels" -}}
helm.sh/chart: {{ include "pd-operator.chart" . }}
{{ include "pd-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pd-operator
{{- end }}

{{- define "pd-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pd-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "pd-operator.peeringName" -}}
{{- default (include "pd-operator.fullname" .) .Values.peering.name }}
{{- end }}

{{/* Peering only matters when several replicas could handle the same objects. */}}
{{- define "pd-operator.peering" -}}
{{- if gt (int .Values.replicaCount) 1 }}true{{ end }}
{{- end }}

{{/* The operator makes its own certificate and (through kopf) its own webhook configuration. */}}
{{- define "pd-operator.webhookSelfSigned" -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.certManager.enabled) }}true{{ end }}
{{- end }}

{{- define "pd-operator.webhookName" -}}
{{- printf "%s-webhook" (include "pd-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pd-operator.webhookSecret" -}}
{{- printf "%s-tls" (include "pd-operator.webhookName" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pd-operator.webhookCertDir" -}}
/etc/pd-operator/webhook-tls
{{- end }}

{{- define "pd-operator.metricsServiceEnabled" -}}
{{- if or .Values.metrics.service.enabled .Values.metrics.serviceMonitor.enabled }}true{{ end }}
{{- end }}

{{/*
The `pd-operator run` flags (the contract with pd_operator.controller.main), one list item each.
A self-signed certificate is made per process, so several replicas behind one Service would each
present a different CA: that combination is refused here.
*/}}
{{- define "pd-operator.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{ with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}

{{- define "pd-operator.args" -}}
- run
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
- --health-port={{ .Values.health.port }}
- --metrics-port={{ .Values.metrics.port }}
{{- range .Values.metrics.scrapers }}
- --metrics-scraper={{ toJson . }}
{{- end }}
{{- if .Values.webhook.enabled }}
- --webhook-port={{ .Values.webhook.port }}
{{- if not (include "pd-operator.webhookSelfSigned" .) }}
- --webhook-cert-dir={{ include "pd-operator.webhookCertDir" . }}
{{- else if include "pd-operator.peering" . }}
{{- fail "webhook: a self-signed certificate needs replicaCount 1; set webhook.certManager.enabled=true (or webhook.enabled=false) to run more replicas" }}
{{- else }}
- --webhook-self-signed
- --webhook-config-name={{ include "pd-operator.fullname" . }}
{{- end }}
{{- else }}
- --no-webhook
{{- end }}
{{- if include "pd-operator.peering" . }}
- --peering={{ include "pd-operator.peeringName" . }}
{{- end }}
- --log-format={{ .Values.logFormat }}
{{- /* The serving pods' tools bundle and the proxy come from this very image. */}}
- --tools-image={{ include "pd-operator.image" . }}
{{- $allowed := .Values.hostPaths.allowed | default (.Files.Get "files/host-paths.yaml" | fromYaml).allowed }}
{{- range concat $allowed .Values.hostPaths.additional | uniq }}
- --allow-host-path={{ . }}
{{- end }}
{{- if .Values.nodeAccess.hostNetwork }}
- --allow-host-network
{{- end }}
{{- if .Values.nodeAccess.controlPlaneTolerations }}
- --allow-control-plane-tolerations
{{- end }}
{{- if .Values.nodeAccess.hostPathCreation }}
- --allow-host-path-creation
{{- end }}
{{- if .Values.alwaysPullImages }}
- --always-pull-images
{{- end }}
{{- end }}

{{- define "pd-operator.proxyAdminSecret" -}}
{{- printf "%s-proxy-admin" (include "pd-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
