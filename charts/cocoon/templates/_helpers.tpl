{{/* The namespace the operator runs in: namespace.name, or the release namespace. */}}
{{- define "cocoon.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{/* The operator's name (Deployment, ServiceAccount, ClusterRole and their bindings). */}}
{{- define "cocoon.operatorName" -}}
{{- printf "%scocoon-operator" .Values.namePrefix -}}
{{- end -}}

{{/* The ClusterRole that may read the operator's /metrics. */}}
{{- define "cocoon.metricsReaderName" -}}
{{- printf "%scocoon-metrics-reader" .Values.namePrefix -}}
{{- end -}}

{{/* The node agents' ClusterRole. */}}
{{- define "cocoon.nodeRoleName" -}}
{{- printf "%scocoon-node" .Values.namePrefix -}}
{{- end -}}

{{/* A node admission policy (and its binding): (list . "pods") → <prefix>cocoon-node-pods. */}}
{{- define "cocoon.nodePolicyName" -}}
{{- $ctx := index . 0 -}}
{{- printf "%scocoon-node-%s" $ctx.Values.namePrefix (index . 1) -}}
{{- end -}}

{{/* Helm's labels, on every object the chart templates (not on the pods: a chart upgrade
alone must not roll them). */}}
{{- define "cocoon.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* repository:tag, the tag defaulting to v<appVersion>. */}}
{{- define "cocoon.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default (printf "v%s" .Chart.AppVersion)) -}}
{{- end -}}

{{/* Where the registry CA and the Docker config are mounted. */}}
{{- define "cocoon.registryCaDir" -}}/etc/cocoon/registry-ca{{- end -}}
{{- define "cocoon.dockerConfigDir" -}}/etc/cocoon/docker{{- end -}}

{{/* The operator's environment after OCI_REGISTRY and the pod's name and namespace: each
setting that is not empty ("" or missing; 0 and false are kept), in a fixed order, then
extraEnv. Rendered as a YAML list (nothing when empty). */}}
{{- define "cocoon.env" -}}
{{- $v := .Values }}
{{- $env := list }}
{{- range $pair := list
    (list "COCOONSET_CONCURRENCY" $v.concurrency.cocoonset)
    (list "HIBERNATION_CONCURRENCY" $v.concurrency.hibernation)
    (list "WATCH_NAMESPACE" $v.watchNamespace)
    (list "OCI_REGISTRY_INSECURE" $v.registry.insecure)
    (list "OCI_REGISTRY_CA_FILE" (ternary (printf "%s/%s" (include "cocoon.registryCaDir" $) $v.registry.caKey) "" (or (not (empty $v.registry.caSecret)) (not (empty $v.registry.caConfigMap)))))
    (list "DOCKER_CONFIG" (ternary (include "cocoon.dockerConfigDir" $) "" (not (empty $v.registry.dockerConfigSecret))))
    (list "COCOON_HIBERNATE_TIMEOUT" $v.timeouts.hibernate)
    (list "COCOON_WAKE_TIMEOUT" $v.timeouts.wake)
    (list "COCOON_SUSPEND_TIMEOUT" $v.timeouts.suspend)
    (list "COCOON_REQUEUE_INTERVAL" $v.timeouts.requeueInterval)
    (list "LEADER_ELECT_LEASE_DURATION" $v.leaderElection.leaseDuration)
    (list "LEADER_ELECT_RENEW_DEADLINE" $v.leaderElection.renewDeadline)
    (list "LEADER_ELECT_RETRY_PERIOD" $v.leaderElection.retryPeriod)
    (list "OPERATOR_LOG_LEVEL" $v.logging.level)
    (list "OPERATOR_LOG_FORMAT" $v.logging.format)
    (list "ACTIVATOR_PORTS" (($v.activator).ports))
    (list "ACTIVATOR_WAKE_WAIT" (($v.activator).wakeWait))
    (list "ACTIVATOR_MAX_CONNECTIONS" (($v.activator).maxConnections))
    (list "ACTIVATOR_VM_CIDRS" (($v.activator).vmCidrs)) }}
{{- $value := index $pair 1 }}
{{- if and (not (kindIs "invalid" $value)) (ne (toString $value) "") }}
{{- $env = append $env (dict "name" (index $pair 0) "value" (toString $value)) }}
{{- end }}
{{- end }}
{{- with $v.registry.credentialsSecret }}
{{- range $pair := list (list "OCI_REGISTRY_USERNAME" "username") (list "OCI_REGISTRY_PASSWORD" "password") (list "OCI_REGISTRY_TOKEN" "token") }}
{{- $env = append $env (dict "name" (index $pair 0) "valueFrom" (dict "secretKeyRef" (dict "name" $v.registry.credentialsSecret "key" (index $pair 1) "optional" true))) }}
{{- end }}
{{- end }}
{{- $env = concat $env $v.extraEnv }}
{{- if $env }}
{{- toYaml $env }}
{{- end }}
{{- end -}}

{{/* An admission policy of the webhook rules (and its binding): (list . "pod-owner") →
<prefix>cocoon-pod-owner. */}}
{{- define "cocoon.admissionPolicyName" -}}
{{- $ctx := index . 0 -}}
{{- printf "%scocoon-%s" $ctx.Values.namePrefix (index . 1) -}}
{{- end -}}

{{/* The identities that may create a bare pod tolerating the cocoon taint, as a CEL list of
strings: the operator's ServiceAccount, then admissionPolicies.podCreators. */}}
{{- define "cocoon.podCreators" -}}
{{- $creators := list (printf "system:serviceaccount:%s:%s" (include "cocoon.namespace" .) (include "cocoon.operatorName" .)) -}}
{{- $quoted := list -}}
{{- range (concat $creators .Values.admissionPolicies.podCreators) -}}
{{- $quoted = append $quoted (toJson .) -}}
{{- end -}}
[{{ join ", " $quoted }}]
{{- end -}}

{{/* A plugin user role: (list . "view") → <prefix>cocoon-view. */}}
{{- define "cocoon.userRoleName" -}}
{{- $ctx := index . 0 -}}
{{- printf "%scocoon-%s" $ctx.Values.namePrefix (index . 1) -}}
{{- end -}}

{{/* The reads of the plugin's verbs in one namespace: all of cocoon-view, and part of
cocoon-edit. */}}
{{- define "cocoon.userViewRules" }}
- apiGroups: ["cocoonset.cocoonstack.io"]
  resources: ["cocoonsets", "cocoonhibernations", "cocooncheckpoints"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["list"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["list"]
- apiGroups: ["cocoonset.cocoonstack.io"]
  resources: ["cocoonsets/scale"]
  verbs: ["get"]
{{- end }}
