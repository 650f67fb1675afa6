{{/* Object names: <fullname>-<component>; fullname is "gpupack" for a release named gpupack. */}}
{{- define "gpupack.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpupack.fullname" -}}
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

{{/* Labels. Call with (dict "root" $ "component" "webhook"). */}}
{{- define "gpupack.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpupack.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpupack.labels" -}}
{{ include "gpupack.selectorLabels" . }}
app.kubernetes.io/part-of: gpupack
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gpupack.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "gpupack.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gpupack.extenderURL" -}}
http://{{ include "gpupack.fullname" . }}-extender.{{ .Release.Namespace }}.svc:{{ .Values.extender.port }}
{{- end -}}

{{- define "gpupack.webhookSecret" -}}
{{ .Values.webhook.certs.secretName | default (printf "%s-webhook-tls" (include "gpupack.fullname" .)) }}
{{- end -}}

{{/* prometheus.io annotations for annotation-based scraping. Call with (dict "root" $ "port" N "scheme" "http"). */}}
{{- define "gpupack.scrapeAnnotations" -}}
{{- if .root.Values.monitoring.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/scheme: {{ .scheme }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/*
The KubeSchedulerConfiguration: files/kube-scheduler-config.yaml (a byte-for-byte copy of
deploy/scheduler/kube-scheduler-config.yaml, the file the integration tests run) with its two
placeholders substituted - ${KUBECONFIG} = "" (in-cluster) and ${EXTENDER_URL} = the extender Service -
then the profile's schedulerName and the leader-election Lease set for this deployment.
Call with (dict "root" $ "schedulerName" "..." "lease" true|false).
*/}}
{{- define "gpupack.schedulerConfig" -}}
{{- $root := .root -}}
{{- $text := $root.Files.Get "files/kube-scheduler-config.yaml" -}}
{{- $text = $text | replace "${KUBECONFIG}" "" | replace "${EXTENDER_URL}" (include "gpupack.extenderURL" $root) -}}
{{- $cfg := fromYaml $text -}}
{{- $profiles := list -}}
{{- range $cfg.profiles -}}
{{- $profiles = append $profiles (merge (dict "schedulerName" $.schedulerName) (omit . "schedulerName")) -}}
{{- end -}}
{{- $_ := set $cfg "profiles" $profiles -}}
{{- if .lease -}}
{{- $le := merge (dict "resourceName" $.schedulerName "resourceNamespace" $root.Release.Namespace) $cfg.leaderElection -}}
{{- $_ := set $cfg "leaderElection" $le -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}
