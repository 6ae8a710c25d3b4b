{{/*
Expand the name of the chart.
*/}}
{{- define "logstream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Create a default fully qualified app name.
We truncate at 63 chars because some Kubernetes name fields are limited to this (by the DNS naming spec).
If release name contains chart name it will be used as a full name.
*/}}
{{- define "logstream.fullname" -}}
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
Create chart name and version as used by the chart label.
*/}}
{{- define "logstream.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels.
*/}}
{{- define "logstream.labels" -}}
helm.sh/chart: {{ include "logstream.chart" . }}
{{ include "logstream.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/component: detector
app.kubernetes.io/part-of: logstream
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Selector labels.
*/}}
{{- define "logstream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "logstream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The name of the ServiceAccount to use.
*/}}
{{- define "logstream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "logstream.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The container image: "<repository>:<tag>", tag defaulting to "<appVersion>-<flavor>".
*/}}
{{- define "logstream.image" -}}
{{- $flavor := .Values.image.flavor | default (ternary "cuda" "cpu" .Values.gpu.enabled) }}
{{- $tag := .Values.image.tag | default (printf "%s-%s" .Chart.AppVersion $flavor) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/*
Deep-merge the map (index . 1) into the map (index . 0), in place; renders nothing. Unlike
sprig's mergeOverwrite, an empty or null value (topics: [], a null pattern, false) overrides
too, as a user who writes it means it.
*/}}
{{- define "logstream.deepMerge" -}}
{{- $dst := index . 0 }}
{{- range $key, $value := index . 1 }}
{{- if and (kindIs "map" $value) (kindIs "map" (get $dst $key)) }}
{{- include "logstream.deepMerge" (list (get $dst $key) $value) }}
{{- else }}
{{- $_ := set $dst $key $value }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Where the ConfigMap (serve.yaml, alerts.yaml) is mounted in the container.
*/}}
{{- define "logstream.configDir" -}}
/etc/logstream/config
{{- end }}

{{/*
The serve config as a YAML document: files/serve.yaml, deep-merged with config.serve, and the
paths the chart owns: model.dir (or model.store, with model.layout "store"), model.device on GPU pods, sink.routes (the mounted
alerts.yaml) when sink.kind is "alerts", repartition.in_process (false when the stage
has its own Deployment), and feedback.tokens_file (the credentials Secret's feedback.tokensKey,
mounted). Every template that needs a setting (the http port,
the consumer group, the brokers) reads it from here, so the ConfigMap, the probes and the
KEDA trigger cannot disagree.
*/}}
{{- define "logstream.serveConfig" -}}
{{- $config := .Files.Get "files/serve.yaml" | fromYaml }}
{{- include "logstream.deepMerge" (list $config (deepCopy .Values.config.serve)) }}
{{- $model := get $config "model" | default dict }}
{{- if eq .Values.model.layout "store" }}
{{- $_ := set $model "store" .Values.model.mountPath }}
{{- $_ := unset $model "dir" }}
{{- else }}
{{- $_ := set $model "dir" .Values.model.mountPath }}
{{- $_ := unset $model "store" }}
{{- end }}
{{- if .Values.gpu.enabled }}
{{- $_ := set $model "device" "cuda" }}
{{- end }}
{{- $_ := set $config "model" $model }}
{{- $sink := get $config "sink" | default dict }}
{{- if eq (get $sink "kind") "alerts" }}
{{- $_ := set $sink "routes" (printf "%s/alerts.yaml" (include "logstream.configDir" .)) }}
{{- $_ := set $config "sink" $sink }}
{{- end }}
{{- if .Values.repartition.enabled }}
{{- $repartition := get $config "repartition" | default dict }}
{{- $_ := set $repartition "in_process" false }}
{{- $_ := set $config "repartition" $repartition }}
{{- end }}
{{- if .Values.feedback.tokensKey }}
{{- $feedback := get $config "feedback" | default dict }}
{{- $_ := set $feedback "tokens_file" (printf "%s/%s" .Values.secrets.mountPath .Values.feedback.tokensKey) }}
{{- $_ := set $config "feedback" $feedback }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/*
The alert routes as a YAML document: files/alerts.yaml deep-merged with config.alerts; empty
when neither has any.
*/}}
{{- define "logstream.alertsConfig" -}}
{{- $config := .Files.Get "files/alerts.yaml" | fromYaml | default dict }}
{{- include "logstream.deepMerge" (list $config (deepCopy .Values.config.alerts)) }}
{{- if $config }}
{{- toYaml $config }}
{{- end }}
{{- end }}

{{/*
The HTTP port of /healthz, /readyz and /metrics: the config's http.port.
*/}}
{{- define "logstream.httpPort" -}}
{{- $config := include "logstream.serveConfig" . | fromYaml }}
{{- $http := get $config "http" | default dict }}
{{- get $http "port" | default 8080 | int }}
{{- end }}

{{/*
The port of POST /feedback: the config's feedback.port; empty when it is null or serve has no
feedback database (neither feedback.database nor the alerts sink's outbox): nothing listens.
*/}}
{{- define "logstream.feedbackPort" -}}
{{- $config := include "logstream.serveConfig" . | fromYaml }}
{{- $feedback := get $config "feedback" | default dict }}
{{- $sink := get $config "sink" | default dict }}
{{- if and (get $feedback "port") (or (get $feedback "database") (eq (get $sink "kind") "alerts")) }}
{{- get $feedback "port" | int }}
{{- end }}
{{- end }}

{{/*
The workload kind: a StatefulSet when the state (alert outbox) is on a PersistentVolumeClaim,
else a Deployment. The HPA and the KEDA ScaledObject target it.
*/}}
{{- define "logstream.workloadKind" -}}
{{- ternary "StatefulSet" "Deployment" .Values.state.persistence.enabled }}
{{- end }}

{{/*
A duration of the alerts config (a number of seconds, or "500ms", "30s", "5m", "1h30m", "1d",
as alerts/config.py parse_duration reads it) in whole seconds, rounded up.
*/}}
{{- define "logstream.durationSeconds" -}}
{{- if kindIs "string" . }}
{{- $units := dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 "d" 86400.0 }}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ms|s|m|h|d)" . -1 }}
{{- $unit := regexFind "(ms|s|m|h|d)$" . }}
{{- $total = addf $total (mulf (float64 (trimSuffix $unit .)) (get $units $unit)) }}
{{- end }}
{{- $total | ceil | int }}
{{- else }}
{{- . | default 0 | ceil | int }}
{{- end }}
{{- end }}

{{/*
How long serve may take after SIGTERM, in whole seconds: its shutdown_grace_seconds (finish the
batch, commit, leave the group), then, with the alerts sink, the alert pipeline's
delivery.shutdown_grace (notify groups still in group_wait, drain deliveries; default 10 s).
*/}}
{{- define "logstream.shutdownGraceSeconds" -}}
{{- $config := include "logstream.serveConfig" . | fromYaml }}
{{- $grace := get $config "shutdown_grace_seconds" | default 20 | ceil | int }}
{{- $sink := get $config "sink" | default dict }}
{{- if eq (get $sink "kind") "alerts" }}
{{- $delivery := get (include "logstream.alertsConfig" . | fromYaml) "delivery" | default dict }}
{{- $drain := hasKey $delivery "shutdown_grace" | ternary (get $delivery "shutdown_grace") 10 }}
{{- $grace = add $grace (include "logstream.durationSeconds" $drain | int) }}
{{- end }}
{{- $grace }}
{{- end }}

{{/*
The pod's terminationGracePeriodSeconds: the value, or serve's whole shutdown grace + 10 s,
so that serve's own graces always run out before the kubelet's SIGKILL.
*/}}
{{- define "logstream.terminationGracePeriodSeconds" -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add (include "logstream.shutdownGraceSeconds" . | int) 10 }}
{{- else }}
{{- .Values.terminationGracePeriodSeconds | int }}
{{- end }}
{{- end }}

{{/*
PromQL label matchers of this release's series, for the PrometheusRule: prometheusRule.selector,
or job="<fullname>",namespace="<release namespace>" (the ServiceMonitor's job is the Service's
name).
*/}}
{{- define "logstream.ruleSelector" -}}
{{- .Values.prometheusRule.selector | default (printf "job=%q,namespace=%q" (include "logstream.fullname" .) .Release.Namespace) }}
{{- end }}

{{/*
The name of the Secret with the credentials; empty when there is none.
*/}}
{{- define "logstream.secretName" -}}
{{- if .Values.secrets.existingSecret }}
{{- .Values.secrets.existingSecret }}
{{- else if .Values.secrets.create }}
{{- printf "%s-credentials" (include "logstream.fullname" .) }}
{{- end }}
{{- end }}

{{/*
Reject value combinations that the schema cannot express; included by the workload
(Deployment or StatefulSet).
*/}}
{{- define "logstream.validate" -}}
{{- if and .Values.keda.enabled .Values.autoscaling.enabled }}
{{- fail "keda.enabled and autoscaling.enabled are mutually exclusive: KEDA creates its own HPA, and two autoscalers on one Deployment fight. Enable one." }}
{{- end }}
{{- if and .Values.secrets.existingSecret .Values.secrets.create }}
{{- fail "secrets.existingSecret and secrets.create are mutually exclusive: use an existing Secret or let the chart make one." }}
{{- end }}
{{- if and .Values.keda.enabled .Values.keda.authentication.enabled (not (include "logstream.secretName" .)) }}
{{- fail "keda.authentication.enabled needs a credentials Secret: set secrets.existingSecret or secrets.create." }}
{{- end }}
{{- $sink := get (include "logstream.serveConfig" . | fromYaml) "sink" | default dict }}
{{- if and (eq (get $sink "kind") "alerts") (not (include "logstream.alertsConfig" .)) }}
{{- fail "config.serve.sink.kind alerts needs alert routes: files/alerts.yaml or config.alerts." }}
{{- end }}
{{- $grace := include "logstream.shutdownGraceSeconds" . | int }}
{{- if le (include "logstream.terminationGracePeriodSeconds" . | int) $grace }}
{{- fail (printf "terminationGracePeriodSeconds (%s) must be longer than serve's shutdown grace, %d s (config.serve.shutdown_grace_seconds, plus config.alerts delivery.shutdown_grace with the alerts sink): the kubelet would SIGKILL serve before it commits and drains the alert outbox. Leave it empty for %d." (include "logstream.terminationGracePeriodSeconds" .) $grace (add $grace 10)) }}
{{- end }}
{{- $repartition := get (include "logstream.serveConfig" . | fromYaml) "repartition" | default dict }}
{{- if and .Values.repartition.enabled (not (get $repartition "topic")) }}
{{- fail "repartition.enabled needs config.serve.repartition.topic (the topic keyed by stream that the scoring pods consume)." }}
{{- end }}
{{- if and .Values.feedback.tokensKey (not (include "logstream.secretName" .)) }}
{{- fail "feedback.tokensKey names a key of the credentials Secret: set secrets.existingSecret or secrets.create." }}
{{- end }}
{{- if and (eq .Values.model.source "initContainer") (not .Values.model.initContainer.image.repository) }}
{{- fail "model.source initContainer needs model.initContainer.image.repository." }}
{{- end }}
{{- end }}
