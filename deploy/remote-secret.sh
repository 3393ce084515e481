#!/usr/bin/env bash
# Prints the remote secret of the cluster kubectl points at: what the other clusters' control
# planes read it with (they watch such Secrets in their namespace: `ferry control serve
# --remote-secrets-namespace ferry-system`, deploy/components/multicluster). The same Secret as
# `istioctl create-remote-secret` writes (crates/k8s/src/remote.rs reads it): labelled
# istio/multiCluster: "true", one key named after the cluster ID, holding a kubeconfig for the
# API server with the token of the ferry-reader account (deploy/components/multicluster).
#
# usage: deploy/remote-secret.sh CLUSTER_ID [--context CTX] [--server URL] [--namespace NS]
#
#   CLUSTER_ID     this cluster's ID (its CLUSTER_ID in ferry-config)
#   --server URL   the API server as the other clusters' control-plane pods reach it (default:
#                  the kubeconfig's, often a loopback address that only this machine reaches;
#                  for kind: https://<the control-plane container's IP>:6443)
#
# Then apply it in each other cluster: `deploy/remote-secret.sh CLUSTER_ID ... | kubectl
# --context OTHER apply -f -`. Its control plane starts reading this cluster at once, and stops
# when the Secret is deleted; no restart.
set -euo pipefail

id='' context=() server='' ns=ferry-system
while (($#)); do
  case $1 in
    --context) context=(--context "$2"); shift 2 ;;
    --server) server=$2; shift 2 ;;
    --namespace) ns=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "remote-secret.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    *) id=$1; shift ;;
  esac
done
if [[ -z $id ]]; then
  echo "remote-secret.sh: give this cluster's ID (see --help)" >&2
  exit 2
fi
kubectl=("${KUBECTL:-kubectl}" "${context[@]}")

token=$("${kubectl[@]}" -n "$ns" get secret ferry-reader-token -o 'jsonpath={.data.token}' | base64 -d)
ca=$("${kubectl[@]}" -n "$ns" get secret ferry-reader-token -o 'jsonpath={.data.ca\.crt}')
if [[ -z $token || -z $ca ]]; then
  echo "remote-secret.sh: Secret $ns/ferry-reader-token has no token yet (is deploy/components/multicluster applied?)" >&2
  exit 1
fi
if [[ -z $server ]]; then
  server=$("${kubectl[@]}" config view --minify --raw -o 'jsonpath={.clusters[0].cluster.server}')
fi

cat <<EOF
apiVersion: v1
kind: Secret
metadata:
  name: istio-remote-secret-$id
  namespace: $ns
  labels:
    istio/multiCluster: "true"
  annotations:
    networking.istio.io/cluster: $id
type: Opaque
stringData:
  $id: |
    apiVersion: v1
    kind: Config
    clusters:
      - name: $id
        cluster:
          server: $server
          certificate-authority-data: $ca
    users:
      - name: $id
        user:
          token: $token
    contexts:
      - name: $id
        context:
          cluster: $id
          user: $id
    current-context: $id
EOF
