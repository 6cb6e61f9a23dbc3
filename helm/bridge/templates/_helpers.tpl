{{/* Chart name, cut to the 63 characters a label value allows. */}}
{{- define "bridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: the release name, unless it already contains the chart name.
Cut to 63 characters because some Kubernetes name fields are limited to that (DNS labels).
*/}}
{{- define "bridge.fullname" -}}
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

{{- define "bridge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "bridge.labels" -}}
helm.sh/chart: {{ include "bridge.chart" . }}
{{ include "bridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels: never change them, a Deployment's selector is immutable. */}}
{{- define "bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "bridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "bridge.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The port of /healthz /readyz /metrics: routes.http.port, 8080 when unset. */}}
{{- define "bridge.httpPort" -}}
{{- dig "http" "port" 8080 .Values.routes | int }}
{{- end }}

{{/*
routes.yaml as the pod reads it: .Values.routes with http bound to 0.0.0.0:<port>, keeping only
the connections some route uses. Helm merges a user's `routes.connections` map into the
example's, so keeping every key would smuggle the example's connections (and their ${VAR}s)
into the user's file; `routes.routes` is a list, which Helm replaces whole, so it decides, with
the endpoint registry's connections (`proxies.connections`, else every connection a route or an
endpoint uses, written out).
*/}}
{{- define "bridge.routesYaml" -}}
{{- $routes := deepCopy .Values.routes }}
{{- $defined := $routes.connections | default dict }}
{{- $used := dict }}
{{- range $route := $routes.routes }}
{{- range $end := list "from" "to" }}
{{- $name := index $route $end "connection" }}
{{- if not (hasKey $defined $name) }}
{{- fail (printf "routes: route %q: %s names connection %q, which routes.connections does not define" $route.name $end $name) }}
{{- end }}
{{- $_ := set $used $name (index $defined $name) }}
{{- end }}
{{- end }}
{{- $endpoints := $routes.endpoints | default dict }}
{{- range $name, $endpoint := $endpoints }}
{{- if not (hasKey $defined $endpoint.connection) }}
{{- fail (printf "routes: endpoint %q names connection %q, which routes.connections does not define" $name $endpoint.connection) }}
{{- end }}
{{- $_ := set $used $endpoint.connection (index $defined $endpoint.connection) }}
{{- end }}
{{- if $endpoints }}
{{- $proxies := $routes.proxies | default dict }}
{{- if $proxies.connections }}
{{- range $name := $proxies.connections }}
{{- if not (hasKey $defined $name) }}
{{- fail (printf "routes: proxies: connection %q is not in routes.connections" $name) }}
{{- end }}
{{- $_ := set $used $name (index $defined $name) }}
{{- end }}
{{- else }}
{{- /* "every connection" would take in the example's too: the ones routes and endpoints use */}}
{{- $_ := set $proxies "connections" (keys $used | sortAlpha) }}
{{- $_ := set $routes "proxies" $proxies }}
{{- end }}
{{- end }}
{{- if $routes.delays }}
{{- $name := $routes.delays.connection }}
{{- if not (hasKey $defined $name) }}
{{- fail (printf "routes: delays: connection %q is not in routes.connections" $name) }}
{{- end }}
{{- $_ := set $used $name (index $defined $name) }}
{{- end }}
{{- $_ := set $routes "connections" $used }}
{{- $_ := set $routes "http" (dict "host" "0.0.0.0" "port" (include "bridge.httpPort" . | int)) }}
{{- toYaml $routes }}
{{- end }}

{{/* The Secret envFrom loads: the existing one, the one this chart creates, or none. */}}
{{- define "bridge.secretName" -}}
{{- if .Values.secret.existingSecret }}
{{- .Values.secret.existingSecret }}
{{- else if .Values.secret.values }}
{{- include "bridge.fullname" . }}
{{- end }}
{{- end }}

{{/* The image of `bridge run`, `bridge check` and `bridge install`. */}}
{{- define "bridge.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The resources of `bridge run`: `resources`, with requests.cpu following `workers` (one core per
worker process, each moves messages on about one) unless it is set.
*/}}
{{- define "bridge.resources" -}}
{{- $resources := deepCopy (.Values.resources | default dict) }}
{{- $requests := $resources.requests | default dict }}
{{- if not (hasKey $requests "cpu") }}
{{- $_ := set $requests "cpu" (printf "%d" (int .Values.workers)) }}
{{- end }}
{{- $_ := set $resources "requests" $requests }}
{{- toYaml $resources }}
{{- end }}

{{/* The pod securityContext of every bridge pod. */}}
{{- define "bridge.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The securityContext of every bridge container. */}}
{{- define "bridge.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
envFrom and env of a bridge container: the Secret named by `secret` (the dict's key; none when
empty) and `env`. Called with (dict "root" $ "secret" NAME).
*/}}
{{- define "bridge.environment" -}}
{{- with .secret }}
envFrom:
  - secretRef:
      name: {{ . }}
{{- end }}
{{- with .root.Values.env }}
env:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The mounts of a bridge container: routes.yaml, /tmp and extraVolumeMounts. */}}
{{- define "bridge.volumeMounts" -}}
- name: routes
  mountPath: /etc/bridge
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The volumes of a bridge pod; called with (dict "root" $ "configMap" NAME). */}}
{{- define "bridge.volumes" -}}
- name: routes
  configMap:
    name: {{ .configMap }}
- name: tmp
  emptyDir: {}
{{- with .root.Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* nodeSelector, affinity, tolerations and priorityClassName of every bridge pod. */}}
{{- define "bridge.scheduling" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Fails the render when routes.yaml references a ${VAR} (one without a `:-default`) that nothing
gives the pod: not in `secret.values` (or empty there), not an `env` entry, and no
`secret.existingSecret`, whose keys the chart cannot see. The pod would otherwise start, find
the variable unset and exit with a config error, again and again.
*/}}
{{- define "bridge.requireVariables" -}}
{{- if not .Values.secret.existingSecret }}
{{- $given := dict }}
{{- range $name, $value := .Values.secret.values }}
{{- if ne (toString $value) "" }}
{{- $_ := set $given $name true }}
{{- end }}
{{- end }}
{{- range .Values.env }}
{{- $_ := set $given .name true }}
{{- end }}
{{- $routes := include "bridge.routesYaml" . | fromYaml }}
{{- $places := dict }}
{{- range $name, $connection := $routes.connections }}
{{- $_ := set $places (printf "connection %q" $name) (toYaml $connection) }}
{{- end }}
{{- $_ := set $places "routes" (toYaml (omit $routes "connections")) }}
{{- range $place, $text := $places }}
{{- range $reference := regexFindAll "\\$\\{[A-Za-z_][A-Za-z0-9_]*\\}" $text -1 }}
{{- $var := $reference | trimPrefix "${" | trimSuffix "}" }}
{{- if not (hasKey $given $var) }}
{{- fail (printf "routes: %s needs ${%s}, and nothing gives the pod a value for it: set secret.values.%s, or secret.existingSecret to a Secret that holds %s, or an env entry named %s (or write ${%s:-default})" $place $var $var $var $var $var) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
