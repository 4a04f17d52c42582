{{/* ------------------------------------------------------------------ names */}}

{{/* The chart's name, or nameOverride. */}}
{{- define "topolvm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object name: fullnameOverride, or <release>-<name> (just <release>
     when it already contains the name). */}}
{{- define "topolvm.fullname" -}}
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

{{/* name-version for the helm.sh/chart label. */}}
{{- define "topolvm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The CSI plugin name: topolvm.io, or topolvm.cybozu.com with useLegacy. It is also the
     LogicalVolume API group and the prefix of StorageClass parameters. */}}
{{- define "topolvm.pluginName" -}}
{{- if .Values.useLegacy -}}topolvm.cybozu.com{{- else -}}topolvm.io{{- end -}}
{{- end -}}

{{/* Names of the objects other objects refer to. */}}
{{- define "topolvm.controllerName" -}}{{ include "topolvm.fullname" . }}-controller{{- end -}}
{{- define "topolvm.nodeName" -}}{{ include "topolvm.fullname" . }}-node{{- end -}}
{{- define "topolvm.lvmdName" -}}{{ include "topolvm.fullname" . }}-lvmd{{- end -}}
{{- define "topolvm.schedulerName" -}}{{ include "topolvm.fullname" . }}-scheduler{{- end -}}
{{- define "topolvm.webhookConfigurationName" -}}{{ include "topolvm.fullname" . }}-hook{{- end -}}
{{/* The Secret of the controller's self-managed webhook certificates. */}}
{{- define "topolvm.selfManagedSecretName" -}}{{ include "topolvm.fullname" . }}-webhook-cert{{- end -}}
{{/* The Secret cert-manager writes the serving certificate to. */}}
{{- define "topolvm.certManagerSecretName" -}}{{ include "topolvm.fullname" . }}-mutatingwebhook{{- end -}}

{{/* ----------------------------------------------------------------- labels */}}

{{- define "topolvm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "topolvm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "topolvm.labels" -}}
helm.sh/chart: {{ include "topolvm.chart" . }}
{{ include "topolvm.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels of a component's objects: (dict "ctx" $ "component" "node"). */}}
{{- define "topolvm.componentLabels" -}}
{{ include "topolvm.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Selector of a component's pods: (dict "ctx" $ "component" "node"). */}}
{{- define "topolvm.componentSelector" -}}
{{ include "topolvm.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* ----------------------------------------------------------------- images */}}

{{/* The topolvm image: repository:reference, or repository@sha256:... for a bare digest. */}}
{{- define "topolvm.image" -}}
{{- $ref := .Values.image.reference | default .Values.image.tag | default .Chart.AppVersion | toString -}}
{{- if hasPrefix "sha256:" $ref -}}
{{- printf "%s@%s" .Values.image.repository $ref -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $ref -}}
{{- end -}}
{{- end -}}

{{/* A CSI sidecar image: (dict "ctx" $ "key" "csiProvisioner"). An empty value means the
     default kubernetes-csi image (the topolvm image does not contain the sidecars). */}}
{{- define "topolvm.csiImage" -}}
{{- $defaults := dict
  "nodeDriverRegistrar" "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.15.0"
  "csiProvisioner" "registry.k8s.io/sig-storage/csi-provisioner:v6.4.0"
  "csiResizer" "registry.k8s.io/sig-storage/csi-resizer:v2.3.0"
  "csiSnapshotter" "registry.k8s.io/sig-storage/csi-snapshotter:v8.7.0"
  "livenessProbe" "registry.k8s.io/sig-storage/livenessprobe:v2.17.0" -}}
{{- $csi := .ctx.Values.image.csi | default dict -}}
{{- index $csi .key | default (index $defaults .key) -}}
{{- end -}}

{{/* The helpers below render nothing, or lines without a leading newline: callers indent
     them with nindent inside a "with include" block, so nothing leaves an empty line. */}}

{{- define "topolvm.imagePullPolicy" -}}
{{- with .Values.image.pullPolicy -}}
imagePullPolicy: {{ . }}
{{- end -}}
{{- end -}}

{{- define "topolvm.imagePullSecrets" -}}
{{- with .Values.image.pullSecrets -}}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* USE_LEGACY for the controller, node and scheduler containers (a list item). */}}
{{- define "topolvm.legacyEnv" -}}
{{- if .Values.useLegacy -}}
- name: USE_LEGACY
  value: "true"
{{- end -}}
{{- end -}}

{{/* Liveness probe timings from livenessProbe.<key>: (dict "ctx" $ "key" "lvmd"). */}}
{{- define "topolvm.probeTimings" -}}
{{- $p := index .ctx.Values.livenessProbe .key | default dict -}}
{{- $out := dict -}}
{{- range $k := list "failureThreshold" "initialDelaySeconds" "timeoutSeconds" "periodSeconds" -}}
{{- with index $p $k }}{{ $_ := set $out $k . }}{{ end -}}
{{- end -}}
{{- with $out }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/* Leader-election flags of the CSI sidecars (list items). */}}
{{- define "topolvm.sidecarLeaderElection" -}}
{{- if .Values.controller.leaderElection.enabled -}}
- --leader-election
- --leader-election-namespace={{ .Release.Namespace }}
{{- end -}}
{{- end -}}

{{/* ----------------------------------------------------------------- lvmd */}}

{{/* All lvmd configurations: the lvmd section, then lvmd.additionalConfigs. */}}
{{- define "topolvm.lvmdConfigs" -}}
{{- $all := list .Values.lvmd -}}
{{- if .Values.lvmd.managed -}}
{{- $all = concat $all (.Values.lvmd.additionalConfigs | default list) -}}
{{- end -}}
{{- toJson $all -}}
{{- end -}}

{{/* lvmd.yaml for one configuration: (dict "ctx" $ "cfg" <entry> "idx" <index>). */}}
{{- define "topolvm.lvmdYaml" -}}
{{- $root := .ctx.Values.lvmd -}}
{{- $cfg := .cfg -}}
{{- $where := ternary "lvmd" (printf "lvmd.additionalConfigs[%d]" (sub .idx 1)) (eq (int .idx) 0) -}}
{{- if not $cfg.deviceClasses -}}
{{- fail (printf "%s.deviceClasses must list at least one device class" $where) -}}
{{- end -}}
{{- $out := dict "socket-name" ($cfg.socketName | default $root.socketName) "device-classes" $cfg.deviceClasses -}}
{{- with $cfg.lvcreateOptionClasses -}}
{{- $_ := set $out "lvcreate-option-classes" . -}}
{{- end -}}
{{- $extra := $cfg.additionalLVMDYamlContent | default $root.additionalLVMDYamlContent | default dict -}}
{{- $out = merge $out (deepCopy $extra) -}}
{{- toYaml $out -}}
{{- end -}}

{{/* ------------------------------------------------------------- webhook */}}

{{/* How the webhook gets its certificate: "" (webhook off), "bundle" (webhook.caBundle +
     webhook.secretName), "cert-manager", or "self-managed" (the controller's own). */}}
{{- define "topolvm.webhookCertMode" -}}
{{- if .Values.webhook.podMutatingWebhook.enabled -}}
{{- if .Values.webhook.caBundle -}}
bundle
{{- else if .Values.webhook.certManager -}}
cert-manager
{{- else -}}
self-managed
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Secret mounted at /certs ("" when nothing is mounted). */}}
{{- define "topolvm.webhookMountedSecret" -}}
{{- $mode := include "topolvm.webhookCertMode" . -}}
{{- if eq $mode "bundle" -}}
{{- required "webhook.secretName is required with webhook.caBundle: the Secret with tls.crt and tls.key signed by that CA" .Values.webhook.secretName -}}
{{- else if eq $mode "cert-manager" -}}
{{- include "topolvm.certManagerSecretName" . -}}
{{- end -}}
{{- end -}}

{{/* Render-time checks, included by every workload template. */}}
{{- define "topolvm.validate" -}}
{{- $marker := and .Values.webhook.podMutatingWebhook (.Values.webhook.podMutatingWebhook.marker) -}}
{{- if and $marker (not .Values.scheduler.enabled) -}}
{{- fail "webhook.podMutatingWebhook.marker=true requires scheduler.enabled=true: the marker resource is meant for topolvm-scheduler's managedResources mode; without the extender it only hides the missing capacity check" -}}
{{- end -}}
{{- if not (has (lower (toString .Values.scheduler.type)) (list "daemonset" "deployment")) -}}
{{- fail (printf "scheduler.type must be daemonset or deployment, not %q" (toString .Values.scheduler.type)) -}}
{{- end -}}
{{- if and (not .Values.controller.leaderElection.enabled) (gt (int .Values.controller.replicaCount) 1) -}}
{{- fail (printf "controller.leaderElection.enabled=false needs controller.replicaCount=1, not %d: without leader election every replica runs the reconcilers, and two that drive the same VolumeMove race (docs/mobility.md, \"Fencing\"); set controller.replicaCount=1, or keep leader election on" (int .Values.controller.replicaCount)) -}}
{{- end -}}
{{- $strategy := .Values.controller.updateStrategy | default dict -}}
{{- if and (not .Values.controller.leaderElection.enabled) $strategy (ne (toString (get $strategy "type")) "Recreate") -}}
{{- fail (printf "controller.leaderElection.enabled=false needs controller.updateStrategy of type Recreate (or none: the chart then sets it), not %s: a rolling update starts the new controller before the old one stops, and without leader election both run the reconcilers and race on the same VolumeMove (docs/mobility.md, \"Fencing\")" (toJson $strategy)) -}}
{{- end -}}
{{- end -}}

{{/* The URL kube-scheduler uses to reach the extender. */}}
{{- define "topolvm.schedulerURL" -}}
{{- if eq (lower .Values.scheduler.type) "deployment" -}}
http://{{ include "topolvm.schedulerName" . }}.{{ .Release.Namespace }}.svc:{{ .Values.scheduler.options.listen.port }}
{{- else -}}
http://127.0.0.1:{{ .Values.scheduler.options.listen.port }}
{{- end -}}
{{- end -}}

{{/* The extender is in marker (managedResources) mode. */}}
{{- define "topolvm.markerMode" -}}
{{- if and .Values.scheduler.enabled .Values.webhook.podMutatingWebhook.marker -}}true{{- end -}}
{{- end -}}

{{/* ------------------------------------------------------------ monitoring */}}

{{/* A PodMonitor scraping port "metrics" of a component's pods:
     (dict "ctx" $ "component" "node" "spec" .Values.node.prometheus.podMonitor). */}}
{{- define "topolvm.podMonitor" -}}
{{- $ctx := .ctx -}}
{{- $pm := .spec -}}
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata:
  name: {{ include "topolvm.fullname" $ctx }}-{{ .component }}
  namespace: {{ $pm.namespace | default $ctx.Release.Namespace }}
  labels:
    {{- include "topolvm.componentLabels" (dict "ctx" $ctx "component" .component) | nindent 4 }}
    {{- with $pm.additionalLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  namespaceSelector:
    matchNames:
      - {{ $ctx.Release.Namespace }}
  selector:
    matchLabels:
      {{- include "topolvm.componentSelector" (dict "ctx" $ctx "component" .component) | nindent 6 }}
  podMetricsEndpoints:
    - port: metrics
      path: /metrics
      {{- with $pm.interval }}
      interval: {{ . }}
      {{- end }}
      {{- with $pm.scrapeTimeout }}
      scrapeTimeout: {{ . }}
      {{- end }}
      {{- with $pm.relabelings }}
      relabelings:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $pm.metricRelabelings }}
      metricRelabelings:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}

{{/* ------------------------------------------------------------- scheduler */}}

{{/* The scheduler's pod template (DaemonSet and Deployment). */}}
{{- define "topolvm.schedulerPodTemplate" -}}
{{- $daemonset := eq (lower .Values.scheduler.type) "daemonset" -}}
{{- $listen := .Values.scheduler.options.listen -}}
metadata:
  labels:
    {{- include "topolvm.componentSelector" (dict "ctx" . "component" "scheduler") | nindent 4 }}
    {{- with .Values.scheduler.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include (print .Template.BasePath "/scheduler/configmap.yaml") . | sha256sum }}
spec:
  serviceAccountName: {{ include "topolvm.schedulerName" . }}
  {{- with .Values.scheduler.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .Values.scheduler.terminationGracePeriodSeconds }}
  terminationGracePeriodSeconds: {{ . }}
  {{- end }}
  {{- with include "topolvm.imagePullSecrets" . }}{{ . | nindent 2 }}{{ end }}
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if $daemonset }}
  # kube-scheduler (host network of the control-plane nodes) calls http://127.0.0.1:<port>.
  hostNetwork: true
  dnsPolicy: ClusterFirstWithHostNet
  {{- end }}
  containers:
    - name: topolvm-scheduler
      image: {{ include "topolvm.image" . }}
      {{- with include "topolvm.imagePullPolicy" . }}{{ . | nindent 6 }}{{ end }}
      securityContext:
        allowPrivilegeEscalation: false
        capabilities:
          drop: ["ALL"]
      command:
        - topolvm
        - scheduler
        - --config=/etc/topolvm/scheduler-options.yaml
        {{- if include "topolvm.markerMode" . }}
        - --managed-resource
        {{- end }}
      {{- with .Values.scheduler.args }}
      args:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- $env := include "topolvm.legacyEnv" . }}
      {{- if or $env .Values.env.topolvm_scheduler }}
      env:
        {{- with $env }}{{ . | nindent 8 }}{{ end }}
        {{- with .Values.env.topolvm_scheduler }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      ports:
        - name: extender
          containerPort: {{ $listen.port }}
          protocol: TCP
      livenessProbe:
        httpGet:
          {{- if $daemonset }}
          host: {{ $listen.host }}
          {{- end }}
          port: {{ $listen.port }}
          path: /status
        {{- with include "topolvm.probeTimings" (dict "ctx" . "key" "topolvm_scheduler") }}{{ . | nindent 8 }}{{ end }}
      readinessProbe:
        httpGet:
          {{- if $daemonset }}
          host: {{ $listen.host }}
          {{- end }}
          port: {{ $listen.port }}
          path: /status
      {{- with .Values.resources.topolvm_scheduler }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - name: scheduler-options
          mountPath: /etc/topolvm
    {{- with .Values.scheduler.additionalContainers }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  volumes:
    - name: scheduler-options
      configMap:
        name: {{ include "topolvm.schedulerName" . }}-options
  {{- with .Values.scheduler.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.scheduler.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.scheduler.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
