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

{{/* Where one tokenizer comes from, as JSON: `path` (the `tokenizer` setting), `mount` (the
     container's volumeMount; none for a file in the image), `volume` (the pod volume the chart
     adds; none for the image or an existing volume) and `existingVolume` (to be checked
     against the pod's volumes). Called with a dict: t (the tokenizer values), where (their
     values path, for messages), volumeName, mountPath (used when t has none). */}}
{{- define "codec-proxy.tokenizerSource" -}}
{{- $t := .t -}}
{{- $where := .where -}}
{{- $source := $t.source | default "volume" -}}
{{- $r := dict -}}
{{- if eq $source "image" -}}
{{- if not (hasPrefix "/" ($t.path | default "")) -}}
{{- fail (printf "%s.path: an absolute path inside the image when %s.source is image" $where $where) -}}
{{- end -}}
{{- $_ := set $r "path" $t.path -}}
{{- else -}}
{{- $mountPath := $t.mountPath | default .mountPath -}}
{{- $mount := dict "name" .volumeName "mountPath" $mountPath "readOnly" true -}}
{{- if eq $source "configMap" -}}
{{- $cm := $t.configMap | default dict -}}
{{- if not $cm.name -}}
{{- fail (printf "%s.configMap.name: the ConfigMap holding the tokenizer" $where) -}}
{{- end -}}
{{- $key := $cm.key | default "tokenizer.json" -}}
{{- $items := list (dict "key" $key "path" $key) -}}
{{- $_ := set $r "volume" (dict "name" .volumeName "configMap" (dict "name" $cm.name "items" $items)) -}}
{{- $_ := set $r "path" (printf "%s/%s" (trimSuffix "/" $mountPath) $key) -}}
{{- else -}}
{{- if $t.existingVolume -}}
{{- /* A volume the pod has anyway: the engine's in sidecar mode, or one of extraVolumes
       that several models share, each mounting its own subPath. */ -}}
{{- $_ := set $mount "name" $t.existingVolume -}}
{{- $_ := set $r "existingVolume" $t.existingVolume -}}
{{- else if not $t.volume -}}
{{- fail (printf "%s.volume: a volume source holding the tokenizer (or %s.existingVolume)" $where $where) -}}
{{- else -}}
{{- $_ := set $r "volume" (merge (dict "name" .volumeName) (deepCopy $t.volume)) -}}
{{- end -}}
{{- with $t.subPath }}{{ $_ := set $mount "subPath" . }}{{ end -}}
{{- if $t.path -}}
{{- $_ := set $r "path" (printf "%s/%s" (trimSuffix "/" $mountPath) (trimPrefix "/" $t.path)) -}}
{{- else -}}
{{- $_ := set $r "path" $mountPath -}}
{{- end -}}
{{- end -}}
{{- $_ := set $r "mount" $mount -}}
{{- end -}}
{{- toJson $r -}}
{{- end -}}

{{/* Every tokenizer the proxy loads, as a JSON list of tokenizerSource results: the one of
     `tokenizer`, or one per entry of `models`, in their order. A model whose upstream speaks
     Codec (`upstream_protocol: codec`) loads none: its entry is empty (no path, no mount). */}}
{{- define "codec-proxy.tokenizers" -}}
{{- /* The list first: a clash of names says more than the clash of mounts it causes. */ -}}
{{- include "codec-proxy.checkModels" . -}}
{{- $all := list -}}
{{- if .Values.models -}}
{{- range $i, $m := .Values.models -}}
{{- $where := printf "models[%d].tokenizer" $i -}}
{{- if eq ($m.upstream_protocol | default $.Values.upstreamProtocol) "codec" -}}
{{- if $m.tokenizer -}}
{{- fail (printf "%s: model %s's upstream speaks Codec (upstream_protocol codec): its published map is the tokenizer; leave tokenizer out" $where ($m.name | default "")) -}}
{{- end -}}
{{- $all = append $all dict -}}
{{- else -}}
{{- if not $m.tokenizer -}}
{{- fail (printf "%s: where model %s's tokenizer comes from (source: volume, configMap or image)" $where ($m.name | default "")) -}}
{{- end -}}
{{- $mountPath := "" -}}
{{- if and (ne ($m.tokenizer.source | default "volume") "image") (not $m.tokenizer.mountPath) -}}
{{- /* The name becomes a directory: only names that are one (or a few, with "/") as they
       are, so that no ".." or odd character ends up in a path. */ -}}
{{- if not (regexMatch "^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$" (toString $m.name)) -}}
{{- fail (printf "%s.mountPath: the name %q is no directory name; give this model a mountPath" $where (toString $m.name)) -}}
{{- end -}}
{{- $mountPath = printf "/models/%s" $m.name -}}
{{- end -}}
{{- $args := dict "t" $m.tokenizer "where" $where "volumeName" (printf "codec-proxy-tokenizer-%d" $i) "mountPath" $mountPath -}}
{{- $all = append $all (include "codec-proxy.tokenizerSource" $args | fromJson) -}}
{{- end -}}
{{- end -}}
{{- else if eq .Values.upstreamProtocol "codec" -}}
{{- $defaults := include "codec-proxy.singleModelDefaults" . | fromYaml -}}
{{- if and .Values.tokenizer (ne (toJson .Values.tokenizer) (toJson $defaults.tokenizer)) -}}
{{- fail "tokenizer: the upstream speaks Codec (upstreamProtocol: codec): its published map is the tokenizer; leave tokenizer at its default (or null)" -}}
{{- end -}}
{{- $all = append $all dict -}}
{{- else -}}
{{- if not .Values.tokenizer -}}
{{- fail "tokenizer: where the model's tokenizer comes from (or a models list)" -}}
{{- end -}}
{{- $args := dict "t" .Values.tokenizer "where" "tokenizer" "volumeName" "codec-proxy-tokenizer" "mountPath" "/models" -}}
{{- $all = append $all (include "codec-proxy.tokenizerSource" $args | fromJson) -}}
{{- end -}}
{{- $paths := list -}}
{{- range $all -}}
{{- with .mount -}}
{{- if has .mountPath $paths -}}
{{- fail (printf "models: two tokenizers are mounted at %s; give one a mountPath of its own" .mountPath) -}}
{{- end -}}
{{- $paths = append $paths .mountPath -}}
{{- end -}}
{{- end -}}
{{- toJson $all -}}
{{- end -}}

{{/* Settings the chart sets from its own values; `config` may not repeat them. */}}
{{- define "codec-proxy.managedSettings" -}}
{{- list "upstream" "tokenizer" "upstream_protocol" "models" "default_model" "host" "port" "admin_port" "drain_timeout" "version_policy" "deployment_id" "docs_url" "safety_policy" "enforce_safety_policy" "api_key" "api_key_file" | toJson -}}
{{- end -}}

{{/* Secret settings: a ConfigMap is readable by anyone who may read the namespace's
     ConfigMaps, so `config` refuses them (deploy/helm_schema.py leaves them out too). */}}
{{- define "codec-proxy.secretSettings" -}}
{{- list "codec_allow_keys" "codec_deny_keys" "uncompressed_keys" | toJson -}}
{{- end -}}

{{/* The single-model values as values.yaml has them. Beside `models` they must stay so (or
     be null): anything else means the values ask for two things at once. A copy, since no
     template can read values.yaml; tests/deploy compares the two. */}}
{{- define "codec-proxy.singleModelDefaults" -}}
upstream:
  - http://vllm.inference.svc.cluster.local:8000
tokenizer:
  source: volume
  mountPath: /models
  path: ""
  subPath: ""
  volume:
    persistentVolumeClaim:
      claimName: model-files
      readOnly: true
  existingVolume: ""
  configMap:
    name: ""
    key: tokenizer.json
{{- end -}}

{{/* The `models` values: refused beside single-model values, and checked here so that a bad
     list fails `helm install` rather than the pods. */}}
{{- define "codec-proxy.checkModels" -}}
{{- if .Values.models -}}
{{- $defaults := include "codec-proxy.singleModelDefaults" . | fromYaml -}}
{{- /* Sidecar mode never reads `upstream`: the engine is on the loopback. */ -}}
{{- if and .Values.upstream (ne (toJson .Values.upstream) (toJson $defaults.upstream)) (not (include "codec-proxy.sidecar" .)) -}}
{{- fail "models and upstream are both set: with models, each entry names its own upstreams; leave upstream at its default (or null)" -}}
{{- end -}}
{{- if and .Values.tokenizer (ne (toJson .Values.tokenizer) (toJson $defaults.tokenizer)) -}}
{{- fail "models and tokenizer are both set: with models, each entry has its own tokenizer; leave tokenizer at its default (or null)" -}}
{{- end -}}
{{- range $key := list "model" "map_id" "zstd_dicts" -}}
{{- if hasKey ($.Values.config | default dict) $key -}}
{{- fail (printf "config.%s is per model when models is set: put it in the model's entry" $key) -}}
{{- end -}}
{{- end -}}
{{- $names := list -}}
{{- range $i, $m := .Values.models -}}
{{- if not $m.name -}}
{{- fail (printf "models[%d].name: the model's name as clients send it in `model`" $i) -}}
{{- end -}}
{{- if not $m.upstreams -}}
{{- fail (printf "models[%d].upstreams: model %s's inference Service URL(s)" $i $m.name) -}}
{{- end -}}
{{- range $name := concat (list $m.name) ($m.aliases | default list) -}}
{{- if has $name $names -}}
{{- fail (printf "models[%d]: the name %s is taken by another model" $i $name) -}}
{{- end -}}
{{- $names = append $names $name -}}
{{- end -}}
{{- end -}}
{{- if and .Values.defaultModel (not (has .Values.defaultModel $names)) -}}
{{- fail (printf "defaultModel: %s is no name of a listed model" .Values.defaultModel) -}}
{{- end -}}
{{- else if .Values.defaultModel -}}
{{- fail "defaultModel needs a models list" -}}
{{- end -}}
{{- end -}}

{{/* The proxy's config file: every key is a setting of proxy/settings.py. */}}
{{- define "codec-proxy.settings" -}}
{{- $managed := include "codec-proxy.managedSettings" . | fromJsonArray -}}
{{- $secret := include "codec-proxy.secretSettings" . | fromJsonArray -}}
{{- range $key, $_ := .Values.config -}}
{{- if has $key $managed -}}
{{- fail (printf "config.%s is set by the chart (see values.yaml): use that value instead" $key) -}}
{{- end -}}
{{- if has $key $secret -}}
{{- fail (printf "config.%s is a secret, and the config file a ConfigMap: set CODEC_PROXY_%s from a Secret with extraEnv (valueFrom.secretKeyRef)" $key (upper $key)) -}}
{{- end -}}
{{- end -}}
{{- include "codec-proxy.checkModels" . -}}
{{- $s := deepCopy (.Values.config | default dict) -}}
{{- $tokenizers := include "codec-proxy.tokenizers" . | fromJsonArray -}}
{{- if .Values.models -}}
{{- /* Each entry as the config file's, but for its tokenizer: the path it is mounted at. */ -}}
{{- $models := list -}}
{{- range $i, $m := .Values.models -}}
{{- $entry := omit (deepCopy $m) "tokenizer" -}}
{{- with (index $tokenizers $i).path }}{{ $_ := set $entry "tokenizer" . }}{{ end -}}
{{- $models = append $models $entry -}}
{{- end -}}
{{- $_ := set $s "models" $models -}}
{{- with .Values.defaultModel }}{{ $_ := set $s "default_model" . }}{{ end -}}
{{- else -}}
{{- if include "codec-proxy.sidecar" . -}}
{{- $_ := set $s "upstream" (list (printf "http://127.0.0.1:%d" (int .Values.sidecar.upstreamPort))) -}}
{{- else -}}
{{- if not .Values.upstream -}}
{{- fail "upstream: the inference Service URL(s), e.g. http://vllm.inference.svc.cluster.local:8000 (or a models list)" -}}
{{- end -}}
{{- $_ := set $s "upstream" .Values.upstream -}}
{{- end -}}
{{- with (index $tokenizers 0).path }}{{ $_ := set $s "tokenizer" . }}{{ end -}}
{{- end -}}
{{- $_ := set $s "upstream_protocol" .Values.upstreamProtocol -}}
{{- $_ := set $s "port" (int .Values.port) -}}
{{- if .Values.adminPort -}}
{{- if eq (int .Values.adminPort) (int .Values.port) -}}
{{- fail "adminPort must differ from port" -}}
{{- end -}}
{{- $_ := set $s "admin_port" (int .Values.adminPort) -}}
{{- end -}}
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

{{/* The container port the probes and scrapers use: the admin port's when there is one (the
     serving port then relays /livez, /readyz and /metrics to the engine). */}}
{{- define "codec-proxy.probePort" -}}
{{- ternary "admin" "http" (not (empty .Values.adminPort)) -}}
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
  {{- with .Values.adminPort }}
  - name: admin
    containerPort: {{ int . }}
    protocol: TCP
  {{- end }}
startupProbe:
  httpGet:
    path: /livez
    port: {{ include "codec-proxy.probePort" . }}
  {{- toYaml .Values.probes.startup | nindent 2 }}
livenessProbe:
  httpGet:
    path: /livez
    port: {{ include "codec-proxy.probePort" . }}
  {{- toYaml .Values.probes.liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ include "codec-proxy.probePort" . }}
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
  {{- range include "codec-proxy.tokenizers" . | fromJsonArray }}
  {{- with .mount }}
  - {{- toYaml . | nindent 4 }}
  {{- end }}
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
{{- range include "codec-proxy.tokenizers" . | fromJsonArray }}
{{- with .volume }}
- {{- toYaml . | nindent 2 }}
{{- end }}
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
prometheus.io/port: {{ int (.Values.adminPort | default .Values.port) | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}
