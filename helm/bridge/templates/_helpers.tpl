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
