#!/bin/bash
# Installs Ferry's CNI plugin on this node and keeps it installed, as istio-cni's install-cni
# does. Runs as the `install-cni` container of the ferry-cni DaemonSet (deploy/base/cni.yaml),
# from a ConfigMap; deploy/test/install-cni.sh tests it on temporary directories.
#
# - The plugin is the ferry binary itself, copied into the host's CNI bin directory under the
#   name the configuration's "type" gives (ferry-cni). The container runtime runs it with
#   CNI_COMMAND set and the configuration on stdin.
# - It is chained at the end of the node's primary CNI configuration: the first file of the
#   configuration directory in name order, the one the runtime uses. A single-plugin `.conf`
#   (or `.json`) is turned into a `.conflist` holding it, then Ferry's entry.
# - Checked again every $INTERVAL seconds: the primary CNI (kindnet, flannel, Calico...) may
#   write its file again and drop the entry.
# - On SIGTERM the plugin is removed only when the API server says that this DaemonSet is gone
#   or being deleted (an uninstall). While the DaemonSet exists (a restart, an upgrade) the
#   entry stays, so that no pod of an enrolled namespace starts uncaptured meanwhile: the plugin
#   fails those pods until the agent is back (fail closed). Any other answer, or none, removes
#   it: a plugin left behind without its agent would fail every new pod on the node.
#
# Environment (default):
#   CNI_BIN_DIR     (/host/opt/cni/bin)    the host's CNI bin directory, mounted
#   CNI_NET_DIR     (/host/etc/cni/net.d)  the host's CNI configuration directory, mounted
#   FERRY_BINARY    (/usr/local/bin/ferry)
#   PLUGIN_TYPE     (ferry-cni)            the binary's name in CNI_BIN_DIR, the entry's "type"
#   PLUGIN_CONFIG   ({"type":"ferry-cni"}) the entry (its "type" is set to PLUGIN_TYPE)
#   INTERVAL        (5)                    seconds between checks
#   READY_FILE      (/tmp/ferry-cni-ready) present while the plugin is installed (readiness)
#   MODE            (daemon)               daemon | install (once) | uninstall (once)
#   KUBE_API        (https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)
#   KUBE_TOKEN_FILE, KUBE_CA_FILE          (the pod's service account's)
#   POD_NAMESPACE, DAEMONSET_NAME          (ferry-system, ferry-cni) the DaemonSet asked about
set -euo pipefail

CNI_BIN_DIR=${CNI_BIN_DIR:-/host/opt/cni/bin}
CNI_NET_DIR=${CNI_NET_DIR:-/host/etc/cni/net.d}
FERRY_BINARY=${FERRY_BINARY:-/usr/local/bin/ferry}
PLUGIN_TYPE=${PLUGIN_TYPE:-ferry-cni}
PLUGIN_CONFIG=${PLUGIN_CONFIG:-'{"type":"ferry-cni"}'}
INTERVAL=${INTERVAL:-5}
READY_FILE=${READY_FILE:-/tmp/ferry-cni-ready}
MODE=${MODE:-daemon}
SA_DIR=/var/run/secrets/kubernetes.io/serviceaccount
KUBE_API=${KUBE_API:-https://${KUBERNETES_SERVICE_HOST:-kubernetes.default.svc}:${KUBERNETES_SERVICE_PORT:-443}}
KUBE_TOKEN_FILE=${KUBE_TOKEN_FILE:-$SA_DIR/token}
KUBE_CA_FILE=${KUBE_CA_FILE:-$SA_DIR/ca.crt}
POD_NAMESPACE=${POD_NAMESPACE:-ferry-system}
DAEMONSET_NAME=${DAEMONSET_NAME:-ferry-cni}

log() { echo "install-cni: $*" >&2; }

# The plugin's entry, with its type forced to PLUGIN_TYPE.
PLUGIN=$(jq -c --arg t "$PLUGIN_TYPE" '.type = $t' <<<"$PLUGIN_CONFIG") || {
  log "PLUGIN_CONFIG is not a JSON object: $PLUGIN_CONFIG"
  exit 2
}

# Writes $2 to $1 atomically (a temporary file in the same directory, renamed), mode 0644. The
# temporary file's name has no .conf/.conflist/.json extension, so no runtime ever loads it.
write_file() {
  local path=$1 content=$2 tmp
  tmp=$(mktemp "$(dirname "$path")/.ferry-cni.XXXXXX") || return 1
  if ! { printf '%s\n' "$content" >"$tmp" && chmod 0644 "$tmp" && mv -f "$tmp" "$path"; }; then
    rm -f "$tmp"
    return 1
  fi
}

# Copies the binary unless the same bytes are there already (copy, then rename: a runtime
# running the plugin meanwhile runs the old file or the new one, never half of one).
install_binary() {
  local target=$CNI_BIN_DIR/$PLUGIN_TYPE tmp
  if cmp -s "$FERRY_BINARY" "$target"; then
    return 0
  fi
  tmp=$(mktemp "$CNI_BIN_DIR/.ferry-cni.XXXXXX") || return 1
  if ! { cp "$FERRY_BINARY" "$tmp" && chmod 0755 "$tmp" && mv -f "$tmp" "$target"; }; then
    rm -f "$tmp"
    log "cannot install $target"
    return 1
  fi
  log "installed $target"
}

# The primary configuration: the first .conf, .conflist or .json file in name order (as libcni
# lists them) that holds JSON.
primary_config() {
  local f
  while IFS= read -r f; do
    if jq -e 'type == "object"' "$f" >/dev/null 2>&1; then
      printf '%s\n' "$f"
      return 0
    fi
  done < <(find "$CNI_NET_DIR" -maxdepth 1 -type f \( -name '*.conf' -o -name '*.conflist' -o -name '*.json' \) | LC_ALL=C sort)
  return 1
}

# Chains the plugin into $1: appended when absent, replaced in place when its configuration
# differs, left alone when it is there as configured (so that nothing is rewritten, and no
# other installer that appends after it is fought).
chain() {
  local conf=$1 out list new
  # shellcheck disable=SC2016 # jq variables, not shell ones
  local program='
    if any(.plugins[]; .type == $t)
    then .plugins |= map(if .type == $t then $p else . end)
    else .plugins += [$p] end'
  case $conf in
    *.conflist)
      out=$conf
      list=$(jq -c . "$conf") || return 1
      ;;
    *)
      # A single plugin's configuration: the same plugin as the first of a list.
      out=${conf%.*}.conflist
      list=$(jq -c '{cniVersion: .cniVersion, name: .name, plugins: [.]}' "$conf") || return 1
      ;;
  esac
  new=$(jq --arg t "$PLUGIN_TYPE" --argjson p "$PLUGIN" "$program" <<<"$list") || {
    log "$conf: not a CNI configuration list"
    return 1
  }
  if [[ $out == "$conf" ]] && [[ $(jq -cS . <<<"$new") == "$(jq -cS . "$conf")" ]]; then
    return 0
  fi
  write_file "$out" "$new" || {
    log "cannot write $out"
    return 1
  }
  if [[ $out != "$conf" ]]; then
    rm -f "$conf"
  fi
  log "chained $PLUGIN_TYPE into $out"
}

install_once() {
  local conf
  install_binary || return 1
  if ! conf=$(primary_config); then
    log "no CNI configuration in $CNI_NET_DIR yet (is the cluster's own CNI installed?)"
    return 1
  fi
  chain "$conf"
}

# Removes the plugin from every configuration list and its binary.
uninstall() {
  local f
  while IFS= read -r f; do
    if jq -e --arg t "$PLUGIN_TYPE" 'any(.plugins[]?; .type == $t)' "$f" >/dev/null 2>&1; then
      if write_file "$f" "$(jq --arg t "$PLUGIN_TYPE" '.plugins |= map(select(.type != $t))' "$f")"; then
        log "removed $PLUGIN_TYPE from $f"
      else
        log "cannot remove $PLUGIN_TYPE from $f"
      fi
    fi
  done < <(find "$CNI_NET_DIR" -maxdepth 1 -type f -name '*.conflist' | LC_ALL=C sort)
  rm -f "$CNI_BIN_DIR/$PLUGIN_TYPE" "$READY_FILE"
}

# Whether the API server says this DaemonSet exists and is not being deleted.
daemonset_stays() {
  local url=$KUBE_API/apis/apps/v1/namespaces/$POD_NAMESPACE/daemonsets/$DAEMONSET_NAME body
  local args=(-sS --max-time 5 -o - -w '\n%{http_code}')
  [[ -r $KUBE_CA_FILE ]] && args+=(--cacert "$KUBE_CA_FILE")
  [[ -r $KUBE_TOKEN_FILE ]] && args+=(-H "Authorization: Bearer $(cat "$KUBE_TOKEN_FILE")")
  if ! body=$(curl "${args[@]}" "$url" 2>/dev/null); then
    log "the API server did not answer whether DaemonSet $POD_NAMESPACE/$DAEMONSET_NAME exists"
    return 1
  fi
  local code=${body##*$'\n'}
  if [[ $code != 200 ]]; then
    log "DaemonSet $POD_NAMESPACE/$DAEMONSET_NAME: the API server answered $code"
    return 1
  fi
  ! jq -e '.metadata.deletionTimestamp' <<<"${body%$'\n'*}" >/dev/null 2>&1
}

on_term() {
  if daemonset_stays; then
    log "stopping; DaemonSet $DAEMONSET_NAME stays (restart or upgrade): the plugin stays installed"
  else
    log "stopping; DaemonSet $DAEMONSET_NAME is gone or going (uninstall): removing the plugin"
    uninstall
  fi
  exit 0
}

case $MODE in
  install)
    install_once
    exit
    ;;
  uninstall)
    uninstall
    exit
    ;;
  daemon) ;;
  *)
    log "MODE must be daemon, install or uninstall, not $MODE"
    exit 2
    ;;
esac

trap on_term TERM INT
while true; do
  if install_once; then
    touch "$READY_FILE"
  else
    rm -f "$READY_FILE"
  fi
  sleep "$INTERVAL" &
  wait $! || true
done
