{{/*
One engine role's Deployment and headless Service (and, in the disaggregated layout, its ClusterIP Service for
the PD proxy). Called with (dict "root" $ "role" "engine"|"prefill"|"decode").
*/}}
{{- define "mocker.engine" -}}
{{- $root := .root }}
{{- $values := $root.Values }}
{{- $role := .role }}
{{- $spec := index $values $role }}
{{- $name := printf "%s-%s" (include "mocker.fullname" $root) $role }}
{{- $workers := int (default 1 $spec.numWorkers) }}
{{- $ranks := int (default 1 $spec.dataParallelSize) }}
{{- $ctx := dict "root" $root "component" $role }}
{{- if and (ne $role "engine") (gt $workers 1) }}
{{- fail (printf "%s.numWorkers: only the aggregated engine runs several workers per pod (the PD proxy reaches each pod's first port)" $role) }}
{{- end }}
{{- if and $values.kvEvents.enabled $values.kvEvents.replayPort }}
{{- if and (lt (int $values.kvEvents.replayPort) (add $values.kvEvents.port (mul $workers $ranks))) (lt (int $values.kvEvents.port) (add $values.kvEvents.replayPort (mul $workers $ranks))) }}
{{- fail (printf "kvEvents: the replay ports overlap the %d event ports from %d" (mul $workers $ranks) (int $values.kvEvents.port)) }}
{{- end }}
{{- end }}
{{- $reserved := list "port" "host" "captures" "shutdown-timeout" "startup-time" "data-parallel-size" "num-workers" "disaggregation-mode" "is-prefill-worker" "is-decode-worker" "kv-events-config" "kv-transfer-allowed-hosts" "pd" "threads" }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  labels:
    {{- include "mocker.labels" $ctx | nindent 4 }}
spec:
  replicas: {{ $spec.replicas }}
  selector:
    matchLabels:
      {{- include "mocker.selectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "mocker.labels" $ctx | nindent 8 }}
    spec:
      # SIGTERM starts mocker's drain, which ends within --shutdown-timeout: the kill comes 10 s later.
      terminationGracePeriodSeconds: {{ add $values.shutdownTimeout 10 }}
      {{- with $values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $values.podSecurityContext | nindent 8 }}
      containers:
        - name: mocker
          image: {{ include "mocker.image" $root }}
          imagePullPolicy: {{ $values.image.pullPolicy }}
          args:
            - serve
            {{- with $spec.threads }}
            - --threads
            - {{ . | quote }}
            {{- end }}
          env:
            - name: MOCKER_PORT
              value: {{ $values.port | quote }}
            - name: MOCKER_CAPTURES
              value: {{ printf "/captures/%s" $values.captures.file | quote }}
            - name: MOCKER_SHUTDOWN_TIMEOUT
              value: {{ $values.shutdownTimeout | quote }}
            {{- if $values.startupTime }}
            - name: MOCKER_STARTUP_TIME
              value: {{ $values.startupTime | quote }}
            {{- end }}
            - name: MOCKER_DATA_PARALLEL_SIZE
              value: {{ $ranks | quote }}
            {{- if eq $role "engine" }}
            - name: MOCKER_NUM_WORKERS
              value: {{ $workers | quote }}
            {{- else }}
            - name: MOCKER_DISAGGREGATION_MODE
              value: {{ $role }}
            {{- end }}
            {{- if eq $role "prefill" }}
            # The host a decode pod pulls this pod's KV from: the pod itself, not the Service in front of it.
            - name: VLLM_NIXL_SIDE_CHANNEL_HOST
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            {{- end }}
            {{- if eq $role "decode" }}
            # A decode pod pulls KV only from the prefill pods: the addresses their headless Service resolves to.
            - name: MOCKER_KV_TRANSFER_ALLOWED_HOSTS
              value: {{ printf "%s-prefill-pods:%d" (include "mocker.fullname" $root) (int $values.port) | quote }}
            {{- end }}
            {{- if $values.kvEvents.enabled }}
            - name: MOCKER_KV_EVENTS_CONFIG
              {{- if $values.kvEvents.replayPort }}
              value: {{ printf "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:%d\",\"replay_endpoint\":\"tcp://*:%d\"}" (int $values.kvEvents.port) (int $values.kvEvents.replayPort) | quote }}
              {{- else }}
              value: {{ printf "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:%d\"}" (int $values.kvEvents.port) | quote }}
              {{- end }}
            {{- end }}
            {{- range $flag, $value := $values.flags }}
            {{- if has $flag $reserved }}
            {{- fail (printf "flags.%s: set by the chart (see values.yaml)" $flag) }}
            {{- end }}
            - name: {{ printf "MOCKER_%s" ($flag | upper | replace "-" "_") }}
              value: {{ include "mocker.envValue" $value }}
            {{- end }}
            {{- range $flag, $value := $spec.flags }}
            {{- if or (has $flag $reserved) (hasKey $values.flags $flag) }}
            {{- fail (printf "%s.flags.%s: set by the chart or in flags already" $role $flag) }}
            {{- end }}
            - name: {{ printf "MOCKER_%s" ($flag | upper | replace "-" "_") }}
              value: {{ include "mocker.envValue" $value }}
            {{- end }}
            {{- with $values.env }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            {{- include "mocker.enginePorts" (dict "root" $root "workers" $workers "ranks" $ranks "service" false) | trim | nindent 12 }}
          readinessProbe:
            {{- toYaml $values.readinessProbe | nindent 12 }}
          livenessProbe:
            {{- toYaml $values.livenessProbe | nindent 12 }}
          {{- with $spec.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          securityContext:
            {{- toYaml $values.securityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- if $values.captures.volume }}
            - name: captures
              mountPath: /captures
              readOnly: true
            {{- end }}
      volumes:
        - name: tmp
          emptyDir: {}
        {{- with $values.captures.volume }}
        - name: captures
          {{- toYaml . | nindent 10 }}
        {{- end }}
      {{- with $values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $values.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
---
# Every pod of this role by its own address (DNS: one A record per pod), with every worker's HTTP port and every
# KV events port: what a KV-aware router subscribes to, and what the ServiceMonitor scrapes.
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}-pods
  labels:
    {{- include "mocker.labels" $ctx | nindent 4 }}
    mocker/service: pods
spec:
  clusterIP: None
  selector:
    {{- include "mocker.selectorLabels" $ctx | nindent 4 }}
  ports:
    {{- include "mocker.enginePorts" (dict "root" $root "workers" $workers "ranks" $ranks "service" true) | trim | nindent 4 }}
{{- if ne $role "engine" }}
---
# What the PD proxy sends this role's hops to.
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  labels:
    {{- include "mocker.labels" $ctx | nindent 4 }}
spec:
  selector:
    {{- include "mocker.selectorLabels" $ctx | nindent 4 }}
  ports:
    - name: http
      port: {{ $values.port }}
      targetPort: http
      protocol: TCP
{{- end }}
{{- end }}
