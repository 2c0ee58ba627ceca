{{/* Names, labels and the pieces several templates share. */}}

{{- define "hami.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hami.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "hami.scheduler" -}}{{ include "hami.fullname" . }}-scheduler{{- end -}}
{{- define "hami.node" -}}{{ include "hami.fullname" . }}-node{{- end -}}
{{- define "hami.webhook" -}}{{ include "hami.fullname" . }}-webhook{{- end -}}
{{- define "hami.webhookSecret" -}}{{ include "hami.fullname" . }}-webhook-tls{{- end -}}
{{- define "hami.webhookCASecret" -}}{{ include "hami.fullname" . }}-webhook-ca{{- end -}}
{{- define "hami.certsJob" -}}{{ include "hami.fullname" . }}-webhook-certs{{- end -}}
{{- define "hami.placementKeySecret" -}}
{{- .Values.placementSigning.existingSecret | default (printf "%s-placement-key" (include "hami.fullname" .)) -}}
{{- end -}}

{{/* Signed placements: the env var and the Secret's volume, the same in the scheduler and the node daemon. */}}
{{- define "hami.placementKeyEnv" -}}
{{- if .Values.placementSigning.enabled }}
- name: HAMI_PLACEMENT_KEYS
  value: /var/run/hami/placement-keys
{{- end }}
{{- end -}}
{{- define "hami.placementKeyMount" -}}
{{- if .Values.placementSigning.enabled }}
- name: placement-keys
  mountPath: /var/run/hami/placement-keys
  readOnly: true
{{- end }}
{{- end -}}
{{- define "hami.placementKeyVolume" -}}
{{- if .Values.placementSigning.enabled }}
- name: placement-keys
  secret:
    secretName: {{ include "hami.placementKeySecret" . }}
    defaultMode: 0400
{{- end }}
{{- end -}}

{{- define "hami.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "hami.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "hami.selector" -}}
app.kubernetes.io/name: {{ include "hami.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "hami.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The vendors with HAMi's keys applied (devices.<vendor>.*, devicePlugin.deviceSplitCount, ...), as JSON: each
has `enabled`, `resources` and `config`. Use it as `include "hami.vendors" . | fromJson`. */}}
{{- define "hami.vendors" -}}
{{- $out := dict -}}
{{- $dp := .Values.devicePlugin -}}
{{- range $name, $vendor := .Values.vendors -}}
{{- $hami := index ($.Values.devices | default dict) $name | default dict -}}
{{- $config := deepCopy ($vendor.config | default dict) -}}
{{- $enabled := $vendor.enabled -}}
{{- if hasKey $hami "enabled" -}}{{- $enabled = $hami.enabled -}}{{- end -}}
{{- $resources := $vendor.resources | default list -}}
{{- with $hami.customresources -}}{{- $resources = . -}}{{- end -}}
{{- if eq $name "nvidia" -}}
{{- range $key := list "deviceSplitCount" "deviceMemoryScaling" "deviceCoreScaling" -}}
{{- if not (kindIs "invalid" (index $dp $key)) -}}{{- $_ := set $config $key (index $dp $key) -}}{{- end -}}
{{- end -}}
{{- if not (kindIs "invalid" $dp.disablecorelimit) -}}
{{- $_ := set $config "disableCoreLimit" (eq (toString $dp.disablecorelimit) "true") -}}
{{- end -}}
{{- with $hami.gpuCorePolicy -}}{{- $_ := set $config "gpuCorePolicy" . -}}{{- end -}}
{{- if hasKey $hami "libCudaLogLevel" -}}{{- $_ := set $config "libCudaLogLevel" (toString $hami.libCudaLogLevel) -}}{{- end -}}
{{- end -}}
{{- if eq $name "ascend" -}}
{{- if hasKey $hami "hamiVnpuCore" -}}{{- $_ := set $config "hamiVnpuCore" $hami.hamiVnpuCore -}}{{- end -}}
{{- with $hami.runtimeClassName -}}{{- $_ := set $config "runtimeClassName" . -}}{{- end -}}
{{- end -}}
{{- $_ := set $out $name (dict "enabled" $enabled "resources" $resources "config" $config) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The vendors switched off: HAMI_DISABLED_VENDORS for every service. */}}
{{- define "hami.disabledVendors" -}}
{{- $off := list -}}
{{- range $name, $vendor := include "hami.vendors" . | fromJson -}}
{{- if not $vendor.enabled -}}{{- $off = append $off $name -}}{{- end -}}
{{- end -}}
{{- join "," $off -}}
{{- end -}}

{{/* kube-scheduler's image without its tag: HAMi's object (registry, repository) or a plain string. */}}
{{- define "hami.kubeSchedulerImage" -}}
{{- $image := .Values.scheduler.kubeScheduler.image -}}
{{- if kindIs "map" $image -}}
{{- $repository := $image.repository | default "kube-scheduler" -}}
{{- if $image.registry -}}{{ $image.registry }}/{{ $repository }}{{- else -}}{{ $repository }}{{- end -}}
{{- else -}}
{{- $image -}}
{{- end -}}
{{- end -}}

{{/* kube-scheduler's image tag: image.tag (HAMi's key) or imageTag, else the cluster's own version. */}}
{{- define "hami.kubeSchedulerTag" -}}
{{- $image := .Values.scheduler.kubeScheduler.image -}}
{{- if and (kindIs "map" $image) $image.tag -}}
{{- $image.tag -}}
{{- else if .Values.scheduler.kubeScheduler.imageTag -}}
{{- .Values.scheduler.kubeScheduler.imageTag -}}
{{- else -}}
{{- regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- end -}}
{{- end -}}

{{/* The node-lock expiry in seconds: HAMi's scheduler.nodeLockExpire (a duration such as 5m) or lockExpirySeconds. */}}
{{- define "hami.lockExpirySeconds" -}}
{{- with .Values.scheduler.nodeLockExpire -}}
{{- $n := regexFind "^[0-9]+" (toString .) | int -}}
{{- $unit := trimPrefix (regexFind "^[0-9]+" (toString .)) (toString .) -}}
{{- if eq $unit "h" -}}{{ mul $n 3600 }}{{- else if eq $unit "m" -}}{{ mul $n 60 }}{{- else -}}{{ $n }}{{- end -}}
{{- else -}}
{{- .Values.scheduler.lockExpirySeconds -}}
{{- end -}}
{{- end -}}

{{/* The webhook's overwriteDefaultScheduler: HAMi's scheduler.forceOverwriteDefaultScheduler when set. */}}
{{- define "hami.overwriteDefaultScheduler" -}}
{{- if kindIs "invalid" .Values.scheduler.forceOverwriteDefaultScheduler -}}
{{- .Values.scheduler.admissionWebhook.overwriteDefaultScheduler -}}
{{- else -}}
{{- .Values.scheduler.forceOverwriteDefaultScheduler -}}
{{- end -}}
{{- end -}}
