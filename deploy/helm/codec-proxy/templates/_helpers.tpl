{{- define "codec-proxy.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "codec-proxy.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "codec-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "codec-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "codec-proxy.labels" -}}
{{ include "codec-proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "codec-proxy.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "codec-proxy.sidecar" -}}
{{- if eq .Values.mode "sidecar" }}true{{ end -}}
{{- end -}}

{{/* Where the proxy finds each file it is given. */}}
{{- define "codec-proxy.configDir" -}}/etc/codec-proxy/config{{- end -}}
{{- define "codec-proxy.safetyDir" -}}/etc/codec-proxy/safety{{- end -}}
{{- define "codec-proxy.apiKeysDir" -}}/etc/codec-proxy/api-keys{{- end -}}

{{- define "codec-proxy.tokenizerPath" -}}
{{- $t := .Values.tokenizer -}}
{{- if eq $t.source "image" -}}
{{- if not (hasPrefix "/" $t.path) -}}
{{- fail "tokenizer.path: an absolute path inside the image when tokenizer.source is image" -}}
{{- end -}}
{{- $t.path -}}
{{- else if eq $t.source "configMap" -}}
{{- if not $t.configMap.name -}}
{{- fail "tokenizer.configMap.name: the ConfigMap holding the tokenizer" -}}
{{- end -}}
{{- printf "%s/%s" (trimSuffix "/" $t.mountPath) $t.configMap.key -}}
{{- else if $t.path -}}
{{- printf "%s/%s" (trimSuffix "/" $t.mountPath) (trimPrefix "/" $t.path) -}}
{{- else -}}
{{- $t.mountPath -}}
{{- end -}}
{{- end -}}

{{/* Settings the chart sets from its own values; `config` may not repeat them. */}}
{{- define "codec-proxy.managedSettings" -}}
{{- list "upstream" "tokenizer" "host" "port" "drain_timeout" "version_policy" "deployment_id" "docs_url" "safety_policy" "enforce_safety_policy" "api_key" "api_key_file" | toJson -}}
{{- end -}}

{{/* The proxy's config file: every key is a setting of proxy/settings.py. */}}
{{- define "codec-proxy.settings" -}}
{{- $managed := include "codec-proxy.managedSettings" . | fromJsonArray -}}
{{- range $key, $_ := .Values.config -}}
{{- if has $key $managed -}}
{{- fail (printf "config.%s is set by the chart (see values.yaml): use that value instead" $key) -}}
{{- end -}}
{{- end -}}
{{- $s := deepCopy (.Values.config | default dict) -}}
{{- if include "codec-proxy.sidecar" . -}}
{{- $_ := set $s "upstream" (list (printf "http://127.0.0.1:%d" (int .Values.sidecar.upstreamPort))) -}}
{{- else -}}
{{- if not .Values.upstream -}}
{{- fail "upstream: the inference Service URL(s), e.g. http://vllm.inference.svc.cluster.local:8000" -}}
{{- end -}}
{{- $_ := set $s "upstream" .Values.upstream -}}
{{- end -}}
{{- $_ := set $s "tokenizer" (include "codec-proxy.tokenizerPath" .) -}}
{{- $_ := set $s "port" (int .Values.port) -}}
{{- $_ := set $s "drain_timeout" .Values.drainTimeout -}}
{{- $p := .Values.policy -}}
{{- $_ := set $s "version_policy" $p.version -}}
{{- with $p.deploymentId }}{{ $_ := set $s "deployment_id" . }}{{ end -}}
{{- with $p.docsUrl }}{{ $_ := set $s "docs_url" . }}{{ end -}}
{{- if $p.safety.existingSecret -}}
{{- $_ := set $s "safety_policy" (printf "%s/%s" (include "codec-proxy.safetyDir" .) $p.safety.key) -}}
{{- $_ := set $s "enforce_safety_policy" $p.safety.enforce -}}
{{- else if $p.safety.enforce -}}
{{- fail "policy.safety.enforce needs policy.safety.existingSecret (the policy file)" -}}
{{- end -}}
{{- if .Values.apiKeys.existingSecret -}}
{{- $_ := set $s "api_key_file" (printf "%s/%s" (include "codec-proxy.apiKeysDir" .) .Values.apiKeys.key) -}}
{{- end -}}
{{- toYaml $s -}}
{{- end -}}

{{/* Seconds: preStop, then the drain, then the proxy's closing grace. */}}
{{- define "codec-proxy.holdSeconds" -}}
{{- add (int .Values.preStopSleepSeconds) (int (ceil .Values.drainTimeout)) -}}
{{- end -}}

{{- define "codec-proxy.terminationGrace" -}}
{{- $minimum := add (include "codec-proxy.holdSeconds" . | int) 15 -}}
{{- if .Values.terminationGracePeriodSeconds -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (sub $minimum 5 | int) -}}
{{- fail (printf "terminationGracePeriodSeconds must exceed preStopSleepSeconds + drainTimeout + 10 (%d)" (sub $minimum 5)) -}}
{{- end -}}
{{- int .Values.terminationGracePeriodSeconds -}}
{{- else -}}
{{- $minimum -}}
{{- end -}}
{{- end -}}

{{/* The codec-proxy container. */}}
{{- define "codec-proxy.container" -}}
name: codec-proxy
image: {{ include "codec-proxy.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
args: ["--config", "{{ include "codec-proxy.configDir" . }}/codec-proxy.yaml"]
{{- with .Values.extraEnv }}
env:
  {{- toYaml . | nindent 2 }}
{{- end }}
ports:
  - name: http
    containerPort: {{ int .Values.port }}
    protocol: TCP
startupProbe:
  httpGet:
    path: /livez
    port: http
  {{- toYaml .Values.probes.startup | nindent 2 }}
livenessProbe:
  httpGet:
    path: /livez
    port: http
  {{- toYaml .Values.probes.liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: http
  {{- toYaml .Values.probes.readiness | nindent 2 }}
lifecycle:
  preStop:
    sleep:
      seconds: {{ int .Values.preStopSleepSeconds }}
resources:
  {{- toYaml .Values.resources | nindent 2 }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
volumeMounts:
  - name: codec-proxy-config
    mountPath: {{ include "codec-proxy.configDir" . }}
    readOnly: true
  - name: codec-proxy-tmp
    mountPath: /tmp
  {{- if ne .Values.tokenizer.source "image" }}
  - name: {{ .Values.tokenizer.existingVolume | default "codec-proxy-tokenizer" }}
    mountPath: {{ .Values.tokenizer.mountPath }}
    readOnly: true
  {{- end }}
  {{- if .Values.policy.safety.existingSecret }}
  - name: codec-proxy-safety-policy
    mountPath: {{ include "codec-proxy.safetyDir" . }}
    readOnly: true
  {{- end }}
  {{- if .Values.apiKeys.existingSecret }}
  - name: codec-proxy-api-keys
    mountPath: {{ include "codec-proxy.apiKeysDir" . }}
    readOnly: true
  {{- end }}
  {{- with .Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* The pod volumes the codec-proxy container needs. */}}
{{- define "codec-proxy.volumes" -}}
- name: codec-proxy-config
  configMap:
    name: {{ include "codec-proxy.fullname" . }}
# TMPDIR: the only place the proxy writes (Prometheus samples with workers > 1).
- name: codec-proxy-tmp
  emptyDir:
    medium: Memory
    sizeLimit: 64Mi
{{- $t := .Values.tokenizer }}
{{- if eq $t.source "configMap" }}
- name: codec-proxy-tokenizer
  configMap:
    name: {{ $t.configMap.name }}
    items:
      - key: {{ $t.configMap.key }}
        path: {{ $t.configMap.key }}
{{- else if and (eq $t.source "volume") (not $t.existingVolume) }}
{{- if not $t.volume }}
{{- fail "tokenizer.volume: a volume source holding the tokenizer (or tokenizer.existingVolume)" }}
{{- end }}
- name: codec-proxy-tokenizer
  {{- toYaml $t.volume | nindent 2 }}
{{- end }}
{{- if .Values.policy.safety.existingSecret }}
- name: codec-proxy-safety-policy
  secret:
    secretName: {{ .Values.policy.safety.existingSecret }}
    items:
      - key: {{ .Values.policy.safety.key }}
        path: {{ .Values.policy.safety.key }}
{{- end }}
{{- if .Values.apiKeys.existingSecret }}
- name: codec-proxy-api-keys
  secret:
    secretName: {{ .Values.apiKeys.existingSecret }}
    items:
      - key: {{ .Values.apiKeys.key }}
        path: {{ .Values.apiKeys.key }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Pod annotations: a config checksum (a changed config file rolls the pods) and scraping. */}}
{{- define "codec-proxy.podAnnotations" -}}
checksum/config: {{ include "codec-proxy.settings" . | sha256sum }}
{{- if .Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ int .Values.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}
