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

{{- define "gpupack.apiServerEnv" -}}
{{- if .Values.kubernetesAPI.host }}
- {name: KUBERNETES_SERVICE_HOST, value: {{ .Values.kubernetesAPI.host | quote }}}
- {name: KUBERNETES_SERVICE_PORT, value: {{ .Values.kubernetesAPI.port | toString | quote }}}
{{- end }}
{{- end }}

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
https://{{ include "gpupack.fullname" . }}-extender.{{ .Release.Namespace }}.svc:{{ .Values.extender.port }}
{{- end -}}

{{/* extender.certs.mode, "" meaning webhook.certs.mode. */}}
{{- define "gpupack.extenderCertsMode" -}}
{{- .Values.extender.certs.mode | default .Values.webhook.certs.mode -}}
{{- end -}}

{{/*
Where kube-scheduler's pods mount Secret <fullname>-scheduler-client (tls.crt, tls.key, ca.crt); the same
paths as schedconfig.CHART_TLS in tests/devcluster/schedconfig.py (a unit test compares the two).
*/}}
{{- define "gpupack.schedulerTLSDir" -}}
/etc/gpupack-scheduler/extender-client
{{- end -}}

{{/*
Helm-generated certificates that survive upgrades and renew themselves. Call with
(dict "root" $ "secret" NAME "ca" CA "cn" CN "dns" LIST "ips" LIST "days" N): the data (base64 tls.crt,
tls.key) and the renew-after time for a Secret NAME, as YAML. The Secret found in the cluster is kept while
its annotation gpupack.io/renew-after lies in the future; otherwise a new certificate is issued from CA
(a sprig certificate, e.g. from buildCustomCert) and renews after 2/3 of `days`.
*/}}
{{- define "gpupack.renewedCert" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .secret -}}
{{- $data := ($existing.data | default dict) -}}
{{- $renewAfter := (($existing.metadata | default dict).annotations | default dict | dig "gpupack.io/renew-after" "") -}}
{{- $due := true -}}
{{- if and $renewAfter (index $data "tls.crt") (index $data "tls.key") -}}
{{- $due = le ((toDate "2006-01-02T15:04:05Z07:00" $renewAfter) | unixEpoch | atoi) (now | unixEpoch | atoi) -}}
{{- end -}}
{{- if $due -}}
{{- $cert := genSignedCert .cn .ips .dns (int .days) .ca -}}
tls.crt: {{ $cert.Cert | b64enc }}
tls.key: {{ $cert.Key | b64enc }}
renewAfter: {{ dateInZone "2006-01-02T15:04:05Z07:00" (now | dateModify (printf "%dh" (div (mul (int .days) 48) 3))) "UTC" | quote }}
{{- else -}}
tls.crt: {{ index $data "tls.crt" }}
tls.key: {{ index $data "tls.key" }}
renewAfter: {{ $renewAfter | quote }}
{{- end -}}
{{- end -}}

{{/*
A CA kept in Secret NAME (tls.crt, tls.key; never mounted by any pod) across upgrades, generated when
missing. Call with (dict "root" $ "secret" NAME "cn" CN); returns YAML with base64 tls.crt and tls.key.
*/}}
{{- define "gpupack.keptCA" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .secret -}}
{{- $data := ($existing.data | default dict) -}}
{{- if and (index $data "tls.crt") (index $data "tls.key") -}}
tls.crt: {{ index $data "tls.crt" }}
tls.key: {{ index $data "tls.key" }}
{{- else -}}
{{- $ca := genCA .cn 3650 -}}
tls.crt: {{ $ca.Cert | b64enc }}
tls.key: {{ $ca.Key | b64enc }}
{{- end -}}
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
placeholders substituted - ${KUBECONFIG} = "" (in-cluster), ${EXTENDER_URL} = the extender Service (https),
${EXTENDER_CA_FILE} / ${EXTENDER_CLIENT_CERT} / ${EXTENDER_CLIENT_KEY} = the mounted Secret
<fullname>-scheduler-client - then the profile's schedulerName and the leader-election Lease set for this deployment.
Call with (dict "root" $ "schedulerName" "..." "lease" true|false).
*/}}
{{- define "gpupack.schedulerConfig" -}}
{{- $root := .root -}}
{{- $text := $root.Files.Get "files/kube-scheduler-config.yaml" -}}
{{- $text = $text | replace "${KUBECONFIG}" "" | replace "${EXTENDER_URL}" (include "gpupack.extenderURL" $root) -}}
{{- $tlsDir := include "gpupack.schedulerTLSDir" $root -}}
{{- $text = $text | replace "${EXTENDER_CA_FILE}" (printf "%s/ca.crt" $tlsDir) | replace "${EXTENDER_CLIENT_CERT}" (printf "%s/tls.crt" $tlsDir) | replace "${EXTENDER_CLIENT_KEY}" (printf "%s/tls.key" $tlsDir) -}}
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
