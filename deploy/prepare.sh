#!/usr/bin/env bash
# Makes what deploy/base needs before its first apply, in the cluster kubectl points at:
#
# - Secret ferry-ca (ca-cert.pem, ca-key.pem): the mesh root the control plane signs with. Made
#   once, in --ca-dir, by `ferry control bundle --state-dir DIR` (which creates a root there when
#   there is none), and given to every cluster of the mesh: keep that directory.
# - ConfigMap ferry-ca-root (root-cert.pem): the same certificate, which node proxies verify the
#   control plane against.
# - ConfigMap ferry-k8s-issuer (issuer, jwks.json): this cluster's service-account token issuer
#   and its public keys, read from the API server, which the CA checks node proxies' tokens
#   with. Run this again after the cluster's signing key changed.
#
# usage: deploy/prepare.sh [--context CTX] [--ca-dir DIR] [--ferry PATH] [--trust-domain TD]
#                          [--namespace NS] [--issuer URL --jwks FILE] [--dry-run]
#
#   --ca-dir DIR       where the root is, or is made (default ./ferry-ca)
#   --ferry PATH       the ferry binary that makes a root (default: `ferry` on PATH, else
#                      target/release/ferry or target/debug/ferry of this repository)
#   --issuer, --jwks   the issuer and its key set instead of reading them from the API server
#   --dry-run          print the objects instead of applying them (no API server needed with
#                      --issuer and --jwks)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
context=() ca_dir=ferry-ca ferry='' trust_domain=cluster.local ns=ferry-system
issuer='' jwks='' dry_run=''
while (($#)); do
  case $1 in
    --context) context=(--context "$2"); shift 2 ;;
    --ca-dir) ca_dir=$2; shift 2 ;;
    --ferry) ferry=$2; shift 2 ;;
    --trust-domain) trust_domain=$2; shift 2 ;;
    --namespace) ns=$2; shift 2 ;;
    --issuer) issuer=$2; shift 2 ;;
    --jwks) jwks=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "prepare.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
kubectl=("${KUBECTL:-kubectl}" "${context[@]}")
say() { echo "prepare.sh: $*" >&2; }

# The mesh root.
if [[ ! -f $ca_dir/ca-cert.pem || ! -f $ca_dir/ca-key.pem ]]; then
  if [[ -z $ferry ]]; then
    for f in "$(command -v ferry || true)" "$root/target/release/ferry" "$root/target/debug/ferry"; do
      if [[ -n $f && -x $f ]]; then ferry=$f; break; fi
    done
  fi
  if [[ -z $ferry ]]; then
    say "no root in $ca_dir and no ferry binary to make one (build it: cargo build -p ferry, or give --ferry)"
    exit 1
  fi
  "$ferry" control bundle --state-dir "$ca_dir" --trust-domain "$trust_domain" >/dev/null
  say "made a new mesh root in $ca_dir (keep it: every cluster of the mesh needs the same one)"
fi

# Refuse to replace a different root already in the cluster: every certificate issued under
# it would stop verifying.
if [[ -z $dry_run ]]; then
  if current=$("${kubectl[@]}" -n "$ns" get secret ferry-ca -o 'jsonpath={.data.ca-cert\.pem}' 2>/dev/null) &&
    [[ -n $current ]] && [[ $(base64 -d <<<"$current") != "$(cat "$ca_dir/ca-cert.pem")" ]]; then
    say "the cluster's Secret $ns/ferry-ca holds another root than $ca_dir/ca-cert.pem; not replacing it"
    say "(delete the Secret first if you mean to change the mesh's root)"
    exit 1
  fi
fi

# The token issuer and its keys.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [[ -z $issuer ]]; then
  discovery=$("${kubectl[@]}" get --raw /.well-known/openid-configuration)
  issuer=$(sed -n 's/.*"issuer" *: *"\([^"]*\)".*/\1/p' <<<"$discovery")
  if [[ -z $issuer ]]; then
    say "the API server's discovery document names no issuer: $discovery"
    exit 1
  fi
fi
if [[ -z $jwks ]]; then
  jwks=$tmp/jwks.json
  "${kubectl[@]}" get --raw /openid/v1/jwks >"$jwks"
fi
say "service-account issuer: $issuer"

objects() {
  local k=("${kubectl[@]}" -n "$ns")
  "${k[@]}" create namespace "$ns" --dry-run=client -o yaml
  echo ---
  "${k[@]}" create secret generic ferry-ca --dry-run=client -o yaml \
    --from-file=ca-cert.pem="$ca_dir/ca-cert.pem" --from-file=ca-key.pem="$ca_dir/ca-key.pem"
  echo ---
  "${k[@]}" create configmap ferry-ca-root --dry-run=client -o yaml \
    --from-file=root-cert.pem="$ca_dir/ca-cert.pem"
  echo ---
  "${k[@]}" create configmap ferry-k8s-issuer --dry-run=client -o yaml \
    --from-literal=issuer="$issuer" --from-file=jwks.json="$jwks"
}

if [[ -n $dry_run ]]; then
  objects
else
  objects | "${kubectl[@]}" apply -f -
fi
