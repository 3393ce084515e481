#!/usr/bin/env bash
# Renders deploy/base and every overlay in deploy/overlays with kubectl's built-in kustomize, and
# validates them offline (deploy/validate.py: the Kubernetes schemas, strictly, and what the
# manifests promise), together with what deploy/prepare.sh and deploy/remote-secret.sh print;
# then tests the CNI installer on temporary directories (deploy/test/install-cni.sh). Nothing
# here reaches a cluster.
#
# usage: deploy/validate.sh [--ferry BIN] [--flags-only]
#   --ferry BIN    also check every flag a container passes against `BIN <command> --help`
#                  (default: target/debug/ferry, when it exists)
#   --flags-only   render and check the flags only (CI runs this after the build)
#   --no-flags     do not check the flags (CI's first run: a binary left from an earlier build
#                  may be older than the manifests)
#
# Needs kubectl 1.21 or later (kustomize v4+: components, patches), python3 with the
# kubernetes-validate package (which brings PyYAML), jq and curl. .ci/run installs what is
# missing. KUBECTL names another kubectl.
set -euo pipefail
cd "$(dirname "$0")/.."
KUBECTL=${KUBECTL:-kubectl}
ferry='' flags_only='' no_flags=''
while (($#)); do
  case $1 in
    --ferry) ferry=$2; shift 2 ;;
    --flags-only) flags_only=1; shift ;;
    --no-flags) no_flags=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "validate.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -n $no_flags ]]; then
  ferry=''
elif [[ -z $ferry && -x target/debug/ferry ]]; then
  ferry=target/debug/ferry
fi
if [[ -n $flags_only && -z $ferry ]]; then
  echo "validate.sh: --flags-only needs a ferry binary (--ferry BIN, or build target/debug/ferry)" >&2
  exit 2
fi

minor=$("$KUBECTL" version --client -o json 2>/dev/null |
  python3 -c 'import json, re, sys; print(re.match(r"\d+", json.load(sys.stdin)["clientVersion"]["minor"]).group())')
if ((minor < 21)); then
  echo "validate.sh: kubectl 1.$minor's kustomize is too old for these manifests (they need kubectl 1.21+)" >&2
  exit 1
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== render ($("$KUBECTL" version --client 2>/dev/null | tr '\n' ' '))"
"$KUBECTL" kustomize deploy/base >"$out/base.yaml"
echo "deploy/base: $(grep -c '^kind:' "$out/base.yaml") objects"
for dir in deploy/overlays/*/; do
  name=$(basename "$dir")
  "$KUBECTL" kustomize "$dir" >"$out/$name.yaml"
  echo "deploy/overlays/$name: $(grep -c '^kind:' "$out/$name.yaml") objects"
done

if [[ -z $flags_only ]]; then
  # What prepare.sh applies, from a stand-in root and issuer: only the objects' shape is
  # checked here (the real root comes from `ferry control bundle`, the issuer from the cluster).
  mkdir -p "$out/ca"
  printf -- '-----BEGIN CERTIFICATE-----\nstand-in\n-----END CERTIFICATE-----\n' >"$out/ca/ca-cert.pem"
  printf -- '-----BEGIN PRIVATE KEY-----\nstand-in\n-----END PRIVATE KEY-----\n' >"$out/ca/ca-key.pem"
  echo '{"keys": []}' >"$out/jwks.json"
  KUBECTL=$KUBECTL bash deploy/prepare.sh --dry-run --ca-dir "$out/ca" \
    --issuer https://kubernetes.default.svc.cluster.local --jwks "$out/jwks.json" \
    >"$out/prepare.yaml" 2>/dev/null
  # What remote-secret.sh prints, with a stand-in kubectl answering for a cluster.
  cat >"$out/kubectl-stub" <<'EOF'
#!/bin/sh
case "$*" in
  *"{.data.token}"*) printf 'c3RhbmQtaW4tdG9rZW4=' ;;
  *"{.data.ca\.crt}"*) printf 'c3RhbmQtaW4tY2E=' ;;
  *"config view"*) printf 'https://203.0.113.7:6443' ;;
  *) echo "kubectl-stub: $*" >&2; exit 1 ;;
esac
EOF
  chmod +x "$out/kubectl-stub"
  KUBECTL=$out/kubectl-stub bash deploy/remote-secret.sh cluster2 >"$out/remote-secret.yaml"
fi

echo "== validate (kubernetes-validate $(python3 -c 'import kubernetes_validate as k; print(k.__version__)' 2>/dev/null || echo '?'))"
args=("$out")
if [[ -n $ferry ]]; then
  args+=(--ferry "$ferry")
else
  echo "(the containers' flags are not checked here: no ferry binary, or --no-flags)"
fi
if [[ -n $flags_only ]]; then
  args+=(--flags-only)
fi
python3 deploy/validate.py "${args[@]}"

if [[ -z $flags_only ]]; then
  echo "== the CNI installer"
  bash deploy/test/install-cni.sh
fi
