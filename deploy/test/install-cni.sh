#!/usr/bin/env bash
# Tests deploy/base/install-cni.sh (the ferry-cni DaemonSet's installer) on temporary
# directories standing in for the host's /opt/cni/bin and /etc/cni/net.d, with an HTTP server on
# loopback standing in for the API server's answer about the DaemonSet. Needs bash, jq, curl and
# python3. Prints one line per check; exits non-zero on the first failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
installer=$here/../base/install-cni.sh
work=$(mktemp -d)
server_pid=
cleanup() {
  [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

passed=0
ok() {
  echo "ok: $*"
  passed=$((passed + 1))
}
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

bin=$work/bin net=$work/net
mkdir -p "$bin" "$net"
printf '#!/bin/sh\necho ferry\n' >"$work/ferry"
chmod 0755 "$work/ferry"
export CNI_BIN_DIR=$bin CNI_NET_DIR=$net FERRY_BINARY=$work/ferry READY_FILE=$work/ready
export PLUGIN_CONFIG='{"type":"ferry-cni","agent_socket":"/var/run/ferry/cni.sock"}'
run() { MODE=$1 bash "$installer" 2>>"$work/log"; }
types() { jq -c '[.plugins[].type]' "$1"; }

# kindnet's list (as kind writes it) and a later file that must be left alone.
cat >"$net/10-kindnet.conflist" <<'EOF'
{"cniVersion": "0.3.1", "name": "kindnet", "plugins": [
  {"type": "ptp", "ipMasq": false, "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}, "mtu": 1500},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
echo '{"cniVersion": "0.4.0", "name": "other", "type": "bridge"}' >"$net/99-other.conf"
cp "$net/99-other.conf" "$work/99-other.orig"

if ! run nonsense; then ok "an unknown MODE is refused"; else fail "MODE=nonsense was accepted"; fi

run install || fail "install into kindnet's list: $(cat "$work/log")"
[[ $(types "$net/10-kindnet.conflist") == '["ptp","portmap","ferry-cni"]' ]] ||
  fail "kindnet's list is $(types "$net/10-kindnet.conflist")"
[[ $(jq -r '.plugins[2].agent_socket' "$net/10-kindnet.conflist") == /var/run/ferry/cni.sock ]] ||
  fail "the entry lost its agent_socket"
[[ $(jq -c '.plugins[0].ipam.ranges' "$net/10-kindnet.conflist") == '[[{"subnet":"10.244.0.0/24"}]]' ]] ||
  fail "the primary plugin's configuration changed"
if ! cmp -s "$bin/ferry-cni" "$work/ferry" || [[ ! -x $bin/ferry-cni ]]; then fail "the binary was not installed"; fi
cmp -s "$net/99-other.conf" "$work/99-other.orig" || fail "a later configuration was touched"
[[ $(stat -c %a "$net/10-kindnet.conflist") == 644 ]] || fail "the list is not mode 0644"
[[ -z $(find "$net" "$bin" -name '.ferry-cni.*') ]] || fail "a temporary file was left behind"
ok "chained last into the primary list (kindnet), binary installed, other files untouched"

inode=$(stat -c %i "$net/10-kindnet.conflist")
run install || fail "second install"
[[ $(types "$net/10-kindnet.conflist") == '["ptp","portmap","ferry-cni"]' ]] ||
  fail "a second install gave $(types "$net/10-kindnet.conflist")"
[[ $(stat -c %i "$net/10-kindnet.conflist") == "$inode" ]] || fail "an unchanged list was rewritten"
ok "installing again changes nothing (no second entry, no rewrite)"

# Someone appends after Ferry's entry: left alone, not moved (no fight between installers).
jq '.plugins += [{"type": "bandwidth"}]' "$net/10-kindnet.conflist" >"$work/t" && mv "$work/t" "$net/10-kindnet.conflist"
run install || fail "install after another plugin was appended"
[[ $(types "$net/10-kindnet.conflist") == '["ptp","portmap","ferry-cni","bandwidth"]' ]] ||
  fail "an entry appended after Ferry's: $(types "$net/10-kindnet.conflist")"
ok "a plugin appended after Ferry's entry stays where it is"

PLUGIN_CONFIG='{"type":"ferry-cni","agent_socket":"/elsewhere.sock"}' run install || fail "reconfigure"
[[ $(jq -c '[.plugins[] | select(.type == "ferry-cni") | .agent_socket]' "$net/10-kindnet.conflist") == '["/elsewhere.sock"]' ]] ||
  fail "a changed entry was not replaced in place"
ok "a changed configuration replaces the entry in place"

# The primary CNI writes its file again without the entry (kindnet restarting): put back.
jq '.plugins |= map(select(.type != "ferry-cni"))' "$net/10-kindnet.conflist" >"$work/t" && mv "$work/t" "$net/10-kindnet.conflist"
run install || fail "install after the entry was dropped"
[[ $(types "$net/10-kindnet.conflist") == '["ptp","portmap","bandwidth","ferry-cni"]' ]] ||
  fail "after the entry was dropped: $(types "$net/10-kindnet.conflist")"
ok "an entry the primary CNI dropped is put back"

run uninstall || fail "uninstall"
[[ $(types "$net/10-kindnet.conflist") == '["ptp","portmap","bandwidth"]' ]] ||
  fail "after uninstall: $(types "$net/10-kindnet.conflist")"
[[ ! -e $bin/ferry-cni ]] || fail "uninstall left the binary"
ok "uninstall removes the entry and the binary, and nothing else"

# A single-plugin .conf as the primary configuration becomes a list.
rm -f "$net"/*
echo '{"cniVersion": "1.0.0", "name": "mynet", "type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "subnet": "10.22.0.0/16"}}' >"$net/10-bridge.conf"
run install || fail "install into a .conf"
[[ ! -e $net/10-bridge.conf ]] || fail "the .conf was left beside its list"
[[ $(jq -c '[.cniVersion, .name, [.plugins[].type]]' "$net/10-bridge.conflist") == '["1.0.0","mynet",["bridge","ferry-cni"]]' ]] ||
  fail "the .conf became $(cat "$net/10-bridge.conflist")"
ok "a single-plugin .conf becomes a .conflist with Ferry's entry after it"

rm -f "$net"/*
if run install; then fail "installed with no CNI configuration"; fi
grep -q "no CNI configuration" "$work/log" || fail "no reason given for an empty directory"
ok "without the cluster's own CNI configuration, install fails and says why"

# Daemon mode and SIGTERM, against a stand-in API server.
api=$work/api
ds=$api/apis/apps/v1/namespaces/ferry-system/daemonsets
mkdir -p "$ds"
python3 -c '
import http.server, socketserver, sys, os
os.chdir(sys.argv[1])
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a): pass
s = socketserver.TCPServer(("127.0.0.1", 0), Quiet)
print(s.server_address[1], flush=True)
s.serve_forever()
' "$api" >"$work/port" &
server_pid=$!
for _ in $(seq 50); do [[ -s $work/port ]] && break; sleep 0.1; done
port=$(cat "$work/port")
[[ -n $port ]] || fail "the stand-in API server did not start"

# One daemon run: installs, is ready, gets SIGTERM; prints whether the plugin stayed.
daemon_then_term() {
  cp "$work/10-kindnet.orig" "$net/10-kindnet.conflist"
  rm -f "$READY_FILE"
  KUBE_API=$1 INTERVAL=1 MODE=daemon KUBE_TOKEN_FILE=/nonexistent KUBE_CA_FILE=/nonexistent \
    bash "$installer" 2>>"$work/log" &
  local pid=$!
  for _ in $(seq 100); do [[ -e $READY_FILE ]] && break; sleep 0.1; done
  [[ -e $READY_FILE ]] || fail "the daemon did not become ready: $(cat "$work/log")"
  [[ $(types "$net/10-kindnet.conflist") == '["ptp","portmap","ferry-cni"]' ]] || fail "the daemon did not chain"
  kill -TERM "$pid"
  wait "$pid" || fail "the daemon exited non-zero on SIGTERM"
  if jq -e 'any(.plugins[]; .type == "ferry-cni")' "$net/10-kindnet.conflist" >/dev/null && [[ -e $bin/ferry-cni ]]; then
    echo stayed
  else
    echo removed
  fi
}
echo '{"cniVersion": "0.3.1", "name": "kindnet", "plugins": [{"type": "ptp"}, {"type": "portmap"}]}' >"$work/10-kindnet.orig"

echo '{"kind": "DaemonSet", "metadata": {"name": "ferry-cni"}}' >"$ds/ferry-cni"
[[ $(daemon_then_term "http://127.0.0.1:$port") == stayed ]] || fail "a restart removed the plugin"
ok "daemon: ready once chained; SIGTERM while the DaemonSet exists (restart, upgrade) keeps the plugin"

echo '{"kind": "DaemonSet", "metadata": {"name": "ferry-cni", "deletionTimestamp": "2026-01-01T00:00:00Z"}}' >"$ds/ferry-cni"
[[ $(daemon_then_term "http://127.0.0.1:$port") == removed ]] || fail "a DaemonSet being deleted kept the plugin"
ok "daemon: SIGTERM while the DaemonSet is being deleted removes the plugin"

rm -f "$ds/ferry-cni"
[[ $(daemon_then_term "http://127.0.0.1:$port") == removed ]] || fail "a deleted DaemonSet (404) kept the plugin"
ok "daemon: SIGTERM once the DaemonSet is gone (404) removes the plugin"

kill "$server_pid"
wait "$server_pid" 2>/dev/null || true
server_pid=
[[ $(daemon_then_term "http://127.0.0.1:$port") == removed ]] || fail "no API answer kept the plugin"
ok "daemon: SIGTERM with no answer from the API server removes the plugin (never left without its agent)"

echo "install-cni: $passed passed, 0 failed"
