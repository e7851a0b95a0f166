{{- define "tokenrouter.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "tokenrouter.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tokenrouter.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .pool }}
{{- end -}}

{{/* Pod annotations: Prometheus scraping of Triton's metrics port */}}
{{- define "tokenrouter.podAnnotations" -}}
{{- if .Values.prometheus.scrape }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.ports.metrics | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/* The model repository volume and, for source=init, the container that fills it */}}
{{- define "tokenrouter.repositoryVolume" -}}
- name: models
{{- if eq .Values.modelRepository.source "pvc" }}
  persistentVolumeClaim:
    claimName: {{ .Values.modelRepository.pvc.claimName }}
    readOnly: true
{{- else if eq .Values.modelRepository.source "init" }}
  emptyDir:
    sizeLimit: {{ .Values.modelRepository.init.sizeLimit }}
{{- else }}
{{- fail (printf "modelRepository.source must be pvc or init; got %q" .Values.modelRepository.source) }}
{{- end }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shmSizeLimit }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.writable.tmpSizeLimit }}
- name: home
  emptyDir:
    sizeLimit: {{ .Values.writable.homeSizeLimit }}
{{- end -}}

{{/* Pod-level hardening: non-root, seccomp, no service-account token, no shared PID
namespace (a sidecar never sees tritonserver's command line, which holds the admin key) */}}
{{- define "tokenrouter.podSecurity" -}}
automountServiceAccountToken: false
shareProcessNamespace: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{- define "tokenrouter.containerSecurity" -}}
securityContext:
  {{- toYaml .Values.containerSecurityContext | nindent 2 }}
{{- end -}}

{{- define "tokenrouter.initContainers" -}}
{{- if eq .Values.modelRepository.source "init" }}
initContainers:
  - name: model-repository
    image: {{ required "modelRepository.init.image is required when modelRepository.source is init" .Values.modelRepository.init.image }}
    command: ["sh", "-c", "cp -a {{ .Values.modelRepository.init.path }}/. /models/"]
    {{- include "tokenrouter.containerSecurity" . | nindent 4 }}
    volumeMounts:
      - {name: models, mountPath: /models}
{{- end }}
{{- end -}}

{{- define "tokenrouter.repositoryMount" -}}
- name: models
  mountPath: {{ .Values.modelRepository.mountPath }}
  readOnly: true
{{- with .Values.modelRepository.pvc.subPath }}
  subPath: {{ . }}
{{- end }}
- name: dshm
  mountPath: /dev/shm
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: /home/tokenrouter
{{- end -}}

{{/* The tritonserver container of one pool: .root, .pool, .spec (router or heavy values) */}}
{{- define "tokenrouter.triton" -}}
- name: triton
  image: "{{ .root.Values.image.repository }}:{{ .root.Values.image.tag }}"
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  {{- include "tokenrouter.containerSecurity" .root | nindent 2 }}
  # NGC's entrypoint (CUDA forward compatibility), then docker/tritonserver.sh: the admin-API
  # restriction, --exit-on-error, --strict-readiness and the stub watchdog, which ends the
  # container (exit 3) when a model's Python stub dies: the kubelet restarts it
  command: ["/opt/nvidia/nvidia_entrypoint.sh", "/opt/tokenrouter/docker/tritonserver.sh"]
  args:
    - --model-repository={{ .root.Values.modelRepository.mountPath }}
    - --model-control-mode=explicit
    {{- range .spec.models }}
    - --load-model={{ . }}
    {{- end }}
    - --http-port={{ .root.Values.ports.http }}
    - --grpc-port={{ .root.Values.ports.grpc }}
    - --metrics-port={{ .root.Values.ports.metrics }}
    - --exit-timeout-secs=30
  ports:
    - {name: http, containerPort: {{ .root.Values.ports.http }}}
    - {name: grpc, containerPort: {{ .root.Values.ports.grpc }}}
    - {name: metrics, containerPort: {{ .root.Values.ports.metrics }}}
  env:
    - {name: TOKENROUTER_STUB_WATCH, value: {{ ternary "1" "0" .root.Values.stubWatch.enabled | quote }}}
    - {name: TOKENROUTER_STUB_WATCH_POLL_S, value: {{ include "tokenrouter.stubWatchPoll" .root | quote }}}
    {{- with .env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  startupProbe:
    httpGet: {path: /v2/health/ready, port: http}
    periodSeconds: {{ .root.Values.probes.startup.periodSeconds }}
    failureThreshold: {{ .root.Values.probes.startup.failureThreshold }}
  readinessProbe:
    httpGet: {path: /v2/health/ready, port: http}
    periodSeconds: {{ .root.Values.probes.readiness.periodSeconds }}
    failureThreshold: {{ .root.Values.probes.readiness.failureThreshold }}
  livenessProbe:
    httpGet: {path: /v2/health/live, port: http}
    periodSeconds: {{ .root.Values.probes.liveness.periodSeconds }}
    failureThreshold: {{ .root.Values.probes.liveness.failureThreshold }}
  resources:
    requests:
      {{- toYaml .spec.resources.requests | nindent 6 }}
      {{- if gt (int .spec.gpus) 0 }}
      nvidia.com/gpu: {{ .spec.gpus }}
      {{- end }}
    limits:
      {{- toYaml .spec.resources.limits | nindent 6 }}
      {{- if gt (int .spec.gpus) 0 }}
      nvidia.com/gpu: {{ .spec.gpus }}
      {{- end }}
  volumeMounts:
    {{- include "tokenrouter.repositoryMount" .root | nindent 4 }}
{{- end -}}

{{/* An HPA on a per-pod queue metric: .root, .pool, .spec */}}
{{- define "tokenrouter.hpa" -}}
{{- if .spec.autoscaling.enabled }}
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ include "tokenrouter.fullname" .root }}-{{ .pool }}
  labels:
    {{- include "tokenrouter.labels" .root | nindent 4 }}
    app.kubernetes.io/component: {{ .pool }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ include "tokenrouter.fullname" .root }}-{{ .pool }}
  minReplicas: {{ .spec.autoscaling.minReplicas }}
  maxReplicas: {{ .spec.autoscaling.maxReplicas }}
  metrics:
    - type: Pods
      pods:
        metric:
          name: {{ .spec.autoscaling.metric }}
          selector:
            matchLabels:
              model: {{ .spec.autoscaling.model }}
        target:
          type: AverageValue
          averageValue: {{ .spec.autoscaling.targetAverageValue | quote }}
{{- end }}
{{- end -}}

{{/* "true" when every heavy pod gets its own address (heavy.pool = statefulset) */}}
{{- define "tokenrouter.heavyPerPod" -}}
{{- $mode := .Values.heavy.pool -}}
{{- if not (has $mode (list "service" "statefulset")) -}}
{{- fail (printf "heavy.pool must be service or statefulset; got %q" $mode) -}}
{{- end -}}
{{- if and (eq $mode "statefulset") .Values.heavy.autoscaling.enabled -}}
{{- fail "heavy.pool=statefulset needs heavy.autoscaling.enabled=false: the router's list of heavy servers is fixed when the chart renders (scale with heavy.replicas and an upgrade)" -}}
{{- end -}}
{{- eq $mode "statefulset" -}}
{{- end -}}

{{/* The router's TOKENROUTER_HEAVY_URL: the heavy Service, or every heavy pod's own address */}}
{{- define "tokenrouter.heavyUrl" -}}
{{- $name := printf "%s-heavy" (include "tokenrouter.fullname" .) -}}
{{- if eq (include "tokenrouter.heavyPerPod" .) "true" -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.heavy.replicas) -}}
{{- $urls = append $urls (printf "%s-%d.%s.%s.svc:%v" $name $i $name $.Release.Namespace $.Values.ports.grpc) -}}
{{- end -}}
{{- join "," $urls -}}
{{- else -}}
{{- printf "%s:%v" $name .Values.ports.grpc -}}
{{- end -}}
{{- end -}}

{{/* stubWatch.pollSeconds, checked: (0, 60] */}}
{{- define "tokenrouter.stubWatchPoll" -}}
{{- $poll := .Values.stubWatch.pollSeconds -}}
{{- if not (and (gt (float64 $poll) 0.0) (le (float64 $poll) 60.0)) -}}
{{- fail (printf "stubWatch.pollSeconds must be in (0, 60] seconds; got %v" $poll) -}}
{{- end -}}
{{- $poll -}}
{{- end -}}
