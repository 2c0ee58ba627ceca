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

{{/* The vendors switched off: HAMI_DISABLED_VENDORS for every service. */}}
{{- define "hami.disabledVendors" -}}
{{- $off := list -}}
{{- range $name, $vendor := .Values.vendors -}}
{{- if not $vendor.enabled -}}{{- $off = append $off $name -}}{{- end -}}
{{- end -}}
{{- join "," $off -}}
{{- end -}}

{{/* kube-scheduler's image tag: the cluster's own version unless given. */}}
{{- define "hami.kubeSchedulerTag" -}}
{{- if .Values.scheduler.kubeScheduler.imageTag -}}
{{- .Values.scheduler.kubeScheduler.imageTag -}}
{{- else -}}
{{- regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- end -}}
{{- end -}}
