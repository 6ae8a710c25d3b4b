{{/*
The pod template of the workload, shared by the Deployment (the default) and the StatefulSet
(state.persistence.enabled). The state volume is an emptyDir in the first and a claim from
the StatefulSet's volumeClaimTemplates in the second.
*/}}
{{- define "logstream.podTemplate" -}}
{{- $secretName := include "logstream.secretName" . -}}
metadata:
  annotations:
    checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
    {{- if .Values.secrets.create }}
    checksum/secret: {{ include (print $.Template.BasePath "/secret.yaml") . | sha256sum }}
    {{- end }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  labels:
    {{- include "logstream.labels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  serviceAccountName: {{ include "logstream.serviceAccountName" . }}
  automountServiceAccountToken: {{ .Values.serviceAccount.automount }}
  terminationGracePeriodSeconds: {{ include "logstream.terminationGracePeriodSeconds" . }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- if and .Values.gpu.enabled .Values.gpu.runtimeClassName }}
  runtimeClassName: {{ .Values.gpu.runtimeClassName }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  {{- if eq .Values.model.source "initContainer" }}
  initContainers:
    - name: model
      image: {{ printf "%s:%s" .Values.model.initContainer.image.repository .Values.model.initContainer.image.tag | trimSuffix ":" }}
      imagePullPolicy: {{ .Values.model.initContainer.image.pullPolicy }}
      command:
        {{- toYaml .Values.model.initContainer.command | nindent 8 }}
      env:
        - name: MODEL_SOURCE
          value: {{ .Values.model.initContainer.sourcePath | quote }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        - name: model
          mountPath: /model-volume
  {{- end }}
  containers:
    - name: {{ .Chart.Name }}
      image: {{ include "logstream.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args: ["--config", "{{ include "logstream.configDir" . }}/serve.yaml"]
      workingDir: {{ .Values.state.mountPath }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      ports:
        - name: http
          containerPort: {{ include "logstream.httpPort" . }}
          protocol: TCP
        {{- with include "logstream.feedbackPort" . }}
        - name: feedback
          containerPort: {{ . }}
          protocol: TCP
        {{- end }}
      {{- with .Values.extraEnv }}
      env:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if or $secretName .Values.extraEnvFrom }}
      envFrom:
        {{- if $secretName }}
        - secretRef:
            name: {{ $secretName }}
        {{- end }}
        {{- with .Values.extraEnvFrom }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      {{- with .Values.startupProbe }}
      startupProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.livenessProbe }}
      livenessProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.readinessProbe }}
      readinessProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      resources:
        {{- $resources := deepCopy .Values.resources }}
        {{- if .Values.gpu.enabled }}
        {{- $limits := get $resources "limits" | default dict }}
        {{- $_ := set $limits .Values.gpu.resourceName .Values.gpu.count }}
        {{- $_ := set $resources "limits" $limits }}
        {{- end }}
        {{- toYaml $resources | nindent 8 }}
      volumeMounts:
        - name: config
          mountPath: {{ include "logstream.configDir" . }}
          readOnly: true
        - name: model
          mountPath: {{ .Values.model.mountPath }}
          readOnly: true
          {{- if and (eq .Values.model.source "pvc") .Values.model.pvc.subPath }}
          subPath: {{ .Values.model.pvc.subPath }}
          {{- end }}
        - name: state
          mountPath: {{ .Values.state.mountPath }}
        - name: tmp
          mountPath: /tmp
        {{- if $secretName }}
        - name: credentials
          mountPath: {{ .Values.secrets.mountPath }}
          readOnly: true
        {{- end }}
        {{- with .Values.volumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "logstream.fullname" . }}
    - name: model
      {{- if eq .Values.model.source "pvc" }}
      persistentVolumeClaim:
        claimName: {{ .Values.model.pvc.claimName | default (printf "%s-model" (include "logstream.fullname" .)) }}
        readOnly: true
      {{- else }}
      emptyDir:
        sizeLimit: {{ .Values.model.initContainer.sizeLimit }}
      {{- end }}
    {{- if not .Values.state.persistence.enabled }}
    - name: state
      emptyDir:
        sizeLimit: {{ .Values.state.sizeLimit }}
    {{- end }}
    - name: tmp
      emptyDir:
        sizeLimit: {{ .Values.tmpSizeLimit }}
    {{- if $secretName }}
    - name: credentials
      secret:
        secretName: {{ $secretName }}
    {{- end }}
    {{- with .Values.volumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- $nodeSelector := deepCopy .Values.nodeSelector }}
  {{- if .Values.gpu.enabled }}
  {{- $nodeSelector = merge (deepCopy .Values.gpu.nodeSelector) $nodeSelector }}
  {{- end }}
  {{- with $nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $tolerations := .Values.tolerations }}
  {{- if .Values.gpu.enabled }}
  {{- $tolerations = concat .Values.tolerations .Values.gpu.tolerations }}
  {{- end }}
  {{- with $tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
