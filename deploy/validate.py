#!/usr/bin/env python3
"""Checks Ferry's rendered manifests offline (deploy/validate.sh renders them and calls this).

usage: validate.py DIR [--kubernetes 1.30,1.37] [--ferry BIN] [--flags-only]

DIR holds the renders: base.yaml and one YAML per overlay, prepare.yaml (deploy/prepare.sh
--dry-run) and remote-secret.yaml (deploy/remote-secret.sh). Checks:

- schema: every object against the Kubernetes OpenAPI schemas bundled with the
  kubernetes-validate package, strictly (an unknown field fails), for each version given; a kind
  without a bundled schema fails too (CRD kinds have no place in these manifests);
- shape: what the manifests promise (docs/kubernetes.md): the node proxy's capabilities,
  priority, tolerations, no CPU limits, probes on paths the admin code serves, RBAC equal to what
  crates/k8s/src/watch.rs watches and to what the CNI agent (crates/cni/src/agent/kube) reads
  and writes, sockets and paths that agree between the pods, every file a
  flag names present in its volume, $(VAR) references defined;
- flags (with --ferry): every flag a container passes to `ferry ...` is in that subcommand's
  --help, and every required one is passed or set through its environment variable. A
  command of PENDING_COMMANDS the binary does not have yet is reported as pending, not failed.

Prints one line per check and `manifests: N passed, M failed`; exits 1 when any failed.
"""

import argparse
import json
import os
import re
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Made by deploy/prepare.sh (or by the user for a multi-cluster mesh), not by kustomize.
MADE_OUTSIDE = {
    ("Secret", "ferry-ca"),
    ("ConfigMap", "ferry-ca-root"),
    ("ConfigMap", "ferry-k8s-issuer"),
}

# Commands the manifests run that a binary may not have yet (none today: `ferry cni agent` landed
# with issue 15). A binary without one of these is "pending"; any other missing command fails.
PENDING_COMMANDS = set()

# Files `ferry node` reads by default (crates/cli/src/node.rs: --token-file, --bundle-file),
# which its pod must therefore provide.
NODE_DEFAULT_FILES = {
    "--token-file": "/var/run/secrets/tokens/istio-token",
    "--bundle-file": "/var/run/secrets/istio/root-cert.pem",
}

passed = 0
failed = 0


def ok(what):
    global passed
    passed += 1
    print(f"ok: {what}")


def fail(what):
    global failed
    failed += 1
    print(f"FAILED: {what}")


def check(cond, what, why=""):
    if cond:
        ok(what)
    else:
        fail(f"{what}{': ' + why if why else ''}")
    return cond


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def find(objs, kind, name):
    for o in objs:
        if o.get("kind") == kind and o.get("metadata", {}).get("name") == name:
            return o
    return None


def pod_spec(o):
    return o["spec"]["template"]["spec"]


def container(o, name):
    for c in pod_spec(o)["containers"]:
        if c["name"] == name:
            return c
    raise KeyError(f"{o['kind']}/{o['metadata']['name']} has no container {name}")


def flag(c, name):
    """The value of --name=value in a container's args, or None."""
    for a in c.get("args", []):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


def workloads(objs):
    return [o for o in objs if o.get("kind") in ("Deployment", "DaemonSet")]


# === schema ===


def check_schema(name, objs, versions):
    import kubernetes_validate

    for v in versions:
        bad = []
        for o in objs:
            what = f"{o.get('kind')}/{o.get('metadata', {}).get('name')}"
            try:
                kubernetes_validate.validate(o, v, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                bad.append(f"{what}: no schema for {o.get('apiVersion')} {o.get('kind')} in Kubernetes {v}")
            except kubernetes_validate.ValidationError as e:
                inner = getattr(e, "caused_by", None) or e
                path = "/".join(str(p) for p in getattr(inner, "absolute_path", []))
                msg = getattr(inner, "message", str(inner)).splitlines()[0]
                bad.append(f"{what}: {path}: {msg}")
        check(not bad, f"{name}: {len(objs)} objects valid against Kubernetes {v} (strict)", "; ".join(bad))


# === shape ===


def admin_routes(path):
    """Every path the Rust file routes (`.route(&["/a", "/b"], ...)`)."""
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    return {p for group in re.findall(r'route\(\s*&\[([^\]]*)\]', text) for p in re.findall(r'"(/[^"]*)"', group)}


def watched_kinds():
    """(group, plural) of every kind crates/k8s/src/watch.rs watches, from its `kinds()`."""
    with open(os.path.join(ROOT, "crates/k8s/src/watch.rs")) as f:
        text = f.read()
    body = text[text.index("fn kinds()"):]
    body = body[: body.index("\n}\n")]
    core = {"Namespace": "", "Node": "", "Pod": "", "Service": "", "EndpointSlice": "discovery.k8s.io"}
    kinds = []
    for k in re.findall(r"erase::<(\w+)>", body):
        if k not in core:
            raise ValueError(f"watch.rs watches {k}: add its API group to validate.py")
        kinds.append((core[k], k))
    kinds += [(g, k) for g, _v, k in re.findall(r'gvk\(\s*"([^"]*)",\s*"([^"]*)",\s*"(\w+)"', body)]

    def plural(k):
        k = k.lower()
        return k[:-1] + "ies" if k.endswith("y") and k[-2] not in "aeiou" else k + "s"

    return {(g, plural(k)) for g, k in kinds}


def check_rbac(name, objs):
    role = find(objs, "ClusterRole", "ferry-control")
    granted = {}
    for r in role["rules"]:
        for g in r.get("apiGroups", []):
            for res in r.get("resources", []):
                granted.setdefault((g, res), set()).update(r.get("verbs", []))
    try:
        watched = watched_kinds()
    except (ValueError, OSError) as e:
        fail(f"{name}: reading the watched kinds from crates/k8s/src/watch.rs: {e}")
        return
    missing = [f"{g or 'core'}/{r}" for g, r in sorted(watched) if not {"list", "watch"} <= granted.get((g, r), set())]
    check(not missing, f"{name}: ClusterRole ferry-control lists and watches the {len(watched)} kinds watch.rs watches", f"missing {missing}")
    with open(os.path.join(ROOT, "crates/k8s/src/status.rs")) as f:
        writes_status = "patch_status" in f.read()
    expected = {k: {"list", "watch"} for k in watched}
    if writes_status:
        expected[("multicluster.x-k8s.io", "serviceexports/status")] = {"patch"}
    with open(os.path.join(ROOT, "crates/k8s/src/imports.rs")) as f:
        imports = f.read()
    if "Patch::Apply" in imports:
        # Server-side apply creates a missing ServiceImport.
        expected[("multicluster.x-k8s.io", "serviceimports")] |= {"create", "patch"}
    if ".delete(" in imports:
        expected[("multicluster.x-k8s.io", "serviceimports")] |= {"delete"}
    extra = {k: sorted(v - expected.get(k, set())) for k, v in granted.items() if v - expected.get(k, set())}
    check(not extra and granted.keys() == expected.keys(), f"{name}: ClusterRole ferry-control grants nothing more (ServiceExport status: patch; ServiceImport: create, patch, delete)", f"extra {extra}, expected {sorted(expected)}")


def cni_agent_rules():
    """{(group, resource): verbs} the CNI agent needs, from crates/cni/src/agent/kube/mod.rs: get,
    list and watch of each kind it watches (`erase::<Kind>`), patch of pods/status when it
    writes the pods' annotation there (`patch_status`)."""
    with open(os.path.join(ROOT, "crates/cni/src/agent/kube/mod.rs")) as f:
        text = f.read()
    core = {"Namespace": "namespaces", "Pod": "pods"}
    rules = {}
    for k in set(re.findall(r"erase::<(\w+)>", text)):
        if k not in core:
            raise ValueError(f"the CNI agent uses {k}: add it to validate.py")
        rules[("", core[k])] = {"get", "list", "watch"}
    if "patch_status" in text:
        rules[("", "pods/status")] = {"patch"}
    return rules


def expand(o, c, value):
    """`value` with each $(VAR) the container defines replaced: a literal, or the pod's
    namespace (fieldRef metadata.namespace); None when a variable is anything else."""
    env = {e["name"]: e for e in c.get("env", [])}

    def one(m):
        e = env.get(m.group(1))
        if e is None:
            raise KeyError(m.group(1))
        if "value" in e:
            return e["value"]
        if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            return o["metadata"]["namespace"]
        raise KeyError(m.group(1))

    try:
        return re.sub(r"\$\((\w+)\)", one, value)
    except KeyError:
        return None


def grants(role):
    """{(group, resource): verbs} of a Role or ClusterRole."""
    out = {}
    for r in role.get("rules", []):
        for g in r.get("apiGroups", []):
            for res in r.get("resources", []):
                out.setdefault((g, res), set()).update(r.get("verbs", []))
    return out


def bound_to(objs, kind, role, ns, sa):
    """Whether a RoleBinding in `ns` binds the `kind` (Role) `role` to ServiceAccount `sa`."""
    return any(
        b.get("kind") == "RoleBinding" and b["metadata"].get("namespace") == ns
        and b["roleRef"].get("kind") == kind and b["roleRef"].get("name") == role
        and any(s.get("kind") == "ServiceAccount" and s.get("name") == sa and s.get("namespace") == ns for s in b.get("subjects", []))
        for b in objs)


def check_remote_secrets(name, objs):
    """Remote secrets are watched in one namespace (--remote-secrets-namespace), read through a
    Role there: never mounted as files, never a ClusterRole on Secrets."""
    wide = [f"{o['metadata']['name']}: {sorted(grants(o).get((g, r), []))}" for o in objs if o.get("kind") == "ClusterRole"
            for g, r in grants(o) if g in ("", "*") and r in ("secrets", "*")]
    check(not wide, f"{name}: no ClusterRole grants Secrets (remote secrets are read through a Role in one namespace)", "; ".join(wide))
    with open(os.path.join(ROOT, "crates/k8s/src/watch/secrets.rs")) as f:
        code = f.read()
    check("Api::namespaced_with" in code and "Api::all" not in code,
          f"{name}: crates/k8s/src/watch/secrets.rs reads Secrets in one namespace (what a Role grants)")
    control = find(objs, "Deployment", "ferry-control")
    c = container(control, "control")
    files = [a for a in c.get("args", []) if a.startswith("--remote-secret=")]
    check(not files, f"{name}: the control plane watches remote secrets instead of reading files at start", f"{files}")
    ns_flag = flag(c, "--remote-secrets-namespace")
    if find(objs, "ServiceAccount", "ferry-reader") is not None:
        check(ns_flag is not None, f"{name}: a cluster of a multi-cluster mesh watches remote secrets (--remote-secrets-namespace)")
    if ns_flag is None:
        check(not any(o.get("kind") == "Role" and ("", "secrets") in grants(o) for o in objs),
              f"{name}: no Role on Secrets where no remote secrets are watched")
        return
    ns = expand(control, c, ns_flag)
    sa = pod_spec(control).get("serviceAccountName")
    roles = [o for o in objs if o.get("kind") == "Role" and o["metadata"].get("namespace") == ns and ("", "secrets") in grants(o)]
    good = [r for r in roles if grants(r) == {("", "secrets"): {"get", "list", "watch"}} and not any(x.get("resourceNames") for x in r["rules"])]
    check(len(roles) == 1 and len(good) == 1, f"{name}: a Role in {ns} grants exactly get, list, watch on Secrets (--remote-secrets-namespace={ns_flag})",
          f"roles {[(r['metadata']['name'], sorted((k, sorted(v)) for k, v in grants(r).items())) for r in roles]}")
    if good:
        check(bound_to(objs, "Role", good[0]["metadata"]["name"], ns, sa),
              f"{name}: Role {good[0]['metadata']['name']} is bound to the control plane's account ({ns}/{sa})")


def lease_verbs():
    """The verbs on leases crates/k8s/src/lease.rs uses: get (get_opt), create, update
    (replace)."""
    with open(os.path.join(ROOT, "crates/k8s/src/lease.rs")) as f:
        code = f.read()
    uses = {"get": "get_opt(" in code or ".get(" in code, "create": ".create(" in code, "update": ".replace(" in code,
            "patch": ".patch(" in code, "delete": ".delete(" in code}
    return {v for v, used in uses.items() if used}


def check_lease(name, objs):
    """Several replicas elect the one that writes (--lease NAMESPACE/NAME), through a Role on
    leases in that namespace granting what lease.rs uses."""
    control = find(objs, "Deployment", "ferry-control")
    c = container(control, "control")
    lease = flag(c, "--lease")
    if not check(lease is not None or control["spec"].get("replicas", 1) <= 1,
                 f"{name}: {control['spec'].get('replicas')} control plane replicas elect the one that writes (--lease)"):
        return
    if lease is None:
        return
    ns = (expand(control, c, lease) or "").split("/")[0]
    env = {e["name"] for e in c.get("env", [])}
    check("POD_NAME" in env or flag(c, "--lease-identity") is not None,
          f"{name}: each replica has its own identity in the Lease (POD_NAME or --lease-identity)")
    wide = [o["metadata"]["name"] for o in objs if o.get("kind") == "ClusterRole" and ("coordination.k8s.io", "leases") in grants(o)]
    check(not wide, f"{name}: no ClusterRole grants leases", f"{wide}")
    verbs = lease_verbs()
    sa = pod_spec(control).get("serviceAccountName")
    roles = [o for o in objs if o.get("kind") == "Role" and o["metadata"].get("namespace") == ns
             and ("coordination.k8s.io", "leases") in grants(o)]
    good = [r for r in roles if grants(r) == {("coordination.k8s.io", "leases"): verbs}]
    check(len(roles) == 1 and len(good) == 1,
          f"{name}: a Role in {ns} grants exactly {sorted(verbs)} on leases (--lease={lease}; what crates/k8s/src/lease.rs uses)",
          f"roles {[(r['metadata']['name'], sorted((k, sorted(v)) for k, v in grants(r).items())) for r in roles]}")
    if good:
        check(bound_to(objs, "Role", good[0]["metadata"]["name"], ns, sa),
              f"{name}: Role {good[0]['metadata']['name']} is bound to the control plane's account ({ns}/{sa})")


def check_cni_rbac(name, objs):
    role = find(objs, "ClusterRole", "ferry-cni")
    binding = find(objs, "ClusterRoleBinding", "ferry-cni")
    if not check(role and binding, f"{name}: ClusterRole and ClusterRoleBinding ferry-cni (the CNI agent)"):
        return
    granted = {}
    for r in role["rules"]:
        for g in r.get("apiGroups", []):
            for res in r.get("resources", []):
                granted.setdefault((g, res), set()).update(r.get("verbs", []))
    try:
        needed = cni_agent_rules()
    except (ValueError, OSError) as e:
        fail(f"{name}: reading what the CNI agent uses from crates/cni/src/agent/kube/mod.rs: {e}")
        return
    check(granted == needed, f"{name}: ClusterRole ferry-cni grants exactly what the CNI agent reads and writes",
          f"granted {sorted((k, sorted(v)) for k, v in granted.items())}, needed {sorted((k, sorted(v)) for k, v in needed.items())}")
    cni = find(objs, "DaemonSet", "ferry-cni")
    sa = pod_spec(cni).get("serviceAccountName") if cni else None
    subjects = binding.get("subjects", [])
    check(binding["roleRef"].get("name") == "ferry-cni" and any(s.get("kind") == "ServiceAccount" and s.get("name") == sa for s in subjects),
          f"{name}: ClusterRole ferry-cni is bound to the CNI DaemonSet's service account ({sa})", f"subjects {subjects}")


def check_shape(name, objs):
    node = find(objs, "DaemonSet", "ferry-node")
    cni = find(objs, "DaemonSet", "ferry-cni")
    control = find(objs, "Deployment", "ferry-control")
    if not check(node and cni and control, f"{name}: has the node proxy, CNI and control-plane workloads"):
        return
    ns, cs, ps = pod_spec(node), pod_spec(cni), pod_spec(control)
    n = container(node, "node")

    # The node proxy.
    check(ns.get("priorityClassName") == "system-node-critical", f"{name}: node proxy is system-node-critical")
    tol = {(t.get("key"), t.get("operator"), t.get("effect")) for t in ns.get("tolerations", [])}
    check({(None, "Exists", "NoSchedule"), (None, "Exists", "NoExecute")} <= tol, f"{name}: node proxy tolerates every taint")
    check(not ns.get("hostNetwork"), f"{name}: node proxy in its own network namespace (as ztunnel)")
    sc = n.get("securityContext", {})
    caps = sc.get("capabilities", {})
    check(sorted(caps.get("add", [])) == ["NET_ADMIN", "NET_RAW", "SYS_ADMIN"] and caps.get("drop") == ["ALL"] and sc.get("privileged") is False,
          f"{name}: node proxy drops every capability but NET_ADMIN, SYS_ADMIN, NET_RAW; not privileged", str(caps))
    strategy = node["spec"].get("updateStrategy", {}).get("rollingUpdate", {})
    check(strategy.get("maxUnavailable") == 0 and strategy.get("maxSurge") == 1, f"{name}: node proxy upgrades by handover (maxSurge 1, maxUnavailable 0)")

    # No CPU limit anywhere; requests and a memory limit everywhere.
    for o in workloads(objs):
        for c in pod_spec(o)["containers"]:
            what = f"{name}: {o['metadata']['name']}/{c['name']}"
            res = c.get("resources", {})
            check("cpu" not in res.get("limits", {}), f"{what} has no CPU limit")
            check({"cpu", "memory"} <= set(res.get("requests", {})) and "memory" in res.get("limits", {}), f"{what} requests CPU and memory, limits memory")

    # Probes: on ports the process listens on, at paths its admin code serves.
    node_routes = admin_routes("crates/node/src/admin.rs")
    rp, lp = n["readinessProbe"]["httpGet"], n["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in n.get("ports", [])}
    check(rp["path"] in node_routes and ports.get(rp["port"], rp["port"]) == port_of(flag(n, "--readiness")),
          f"{name}: node proxy readiness {rp['path']} on its --readiness port", f"{rp}, routes {sorted(node_routes)}")
    check(lp["path"] in node_routes and ports.get(lp["port"], lp["port"]) == port_of(flag(n, "--stats")),
          f"{name}: node proxy liveness {lp['path']} on its --stats port")
    check("/healthz/ready" not in lp["path"], f"{name}: node proxy liveness is not its readiness (a control-plane outage must not restart it)")
    c = container(control, "control")
    cports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    metrics_port = port_of(flag(c, "--metrics-listen"))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        g = c[probe]["httpGet"]
        check(cports.get(g["port"], g["port"]) == metrics_port, f"{name}: control plane {probe} on its --metrics-listen port")
    check(not flag(c, "--listen").startswith("127.") and not flag(c, "--metrics-listen").startswith("127."), f"{name}: control plane listens beyond loopback")

    # The control plane's replicas and their budget.
    pdb = find(objs, "PodDisruptionBudget", "ferry-control")
    labels = control["spec"]["template"]["metadata"]["labels"]
    check(pdb is not None and pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
          and control["spec"]["replicas"] > pdb["spec"]["minAvailable"], f"{name}: PodDisruptionBudget selects the control plane and leaves one replica to evict")

    # Services select pods, by ports the pods name.
    for svc in (o for o in objs if o.get("kind") == "Service"):
        sel = svc["spec"]["selector"]
        backends = [o for o in workloads(objs) if sel.items() <= o["spec"]["template"]["metadata"]["labels"].items()]
        names = {p["name"] for o in backends for ct in pod_spec(o)["containers"] for p in ct.get("ports", [])}
        targets = [p["targetPort"] for p in svc["spec"]["ports"]]
        check(backends and all(isinstance(t, int) or t in names for t in targets), f"{name}: Service {svc['metadata']['name']} selects pods with its target ports")

    # The CNI side: host network (no CNI for its own pod), sockets that agree.
    check(cs.get("hostNetwork") is True, f"{name}: ferry-cni in the host network (no CNI plugin runs for the agent's own pod)")
    check(cs.get("priorityClassName") == "system-node-critical", f"{name}: ferry-cni is system-node-critical")
    agent, install = container(cni, "agent"), container(cni, "install-cni")
    caps = install.get("securityContext", {}).get("capabilities", {})
    check(caps.get("drop") == ["ALL"] and not caps.get("add"), f"{name}: ferry-cni/install-cni has no capability")
    sc = agent.get("securityContext", {})
    caps = sc.get("capabilities", {})
    check(caps.get("drop") == ["ALL"] and sorted(caps.get("add", [])) == ["SYS_ADMIN", "SYS_PTRACE"] and sc.get("privileged") is False,
          f"{name}: ferry-cni/agent drops every capability but SYS_ADMIN, SYS_PTRACE (pods that started before it); not privileged", str(caps))
    check(flag(n, "--zds-socket") == flag(agent, "--zds-socket"), f"{name}: node proxy and agent name the same ZDS socket", f"{flag(n, '--zds-socket')} / {flag(agent, '--zds-socket')}")
    env = {e["name"]: e.get("value") for e in install.get("env", [])}
    plugin = json.loads(env["PLUGIN_CONFIG"])
    check(plugin.get("agent_socket") == flag(agent, "--plugin-socket") and plugin.get("type") == env["PLUGIN_TYPE"],
          f"{name}: the chained plugin's agent_socket is the agent's --plugin-socket")

    def host_path(o, c, path):
        """The host path behind a container path, when it is on a hostPath volume."""
        if path is None:
            return None
        vols = {v["name"]: v for v in pod_spec(o).get("volumes", [])}
        for m in c.get("volumeMounts", []):
            mp = m["mountPath"].rstrip("/")
            if path == mp or path.startswith(mp + "/"):
                hp = vols[m["name"]].get("hostPath")
                return hp["path"] + path[len(mp):] if hp else None
        return None

    for what, o, ct, p in (("node proxy's ZDS socket", node, n, flag(n, "--zds-socket")),
                           ("agent's ZDS socket", cni, agent, flag(agent, "--zds-socket")),
                           ("agent's plugin socket", cni, agent, flag(agent, "--plugin-socket"))):
        check(host_path(o, ct, p) == p, f"{name}: the {what} {p} is the same path on the host", str(host_path(o, ct, p)))
    proc = flag(agent, "--proc-dir")
    check(host_path(cni, agent, proc) == "/proc", f"{name}: the agent's --proc-dir {proc} is the host's /proc", str(host_path(cni, agent, proc)))

    # Files named by flags (and the node proxy's default files) are in their volumes.
    def resolvable(o, c, path, made):
        vols = {v["name"]: v for v in pod_spec(o).get("volumes", [])}
        for m in sorted(c.get("volumeMounts", []), key=lambda m: -len(m["mountPath"])):
            mp = m["mountPath"].rstrip("/")
            if not path.startswith(mp + "/"):
                continue
            key = path[len(mp) + 1:]
            v = vols[m["name"]]
            if "configMap" in v or "secret" in v:
                kind, ref = ("ConfigMap", v["configMap"]["name"]) if "configMap" in v else ("Secret", v["secret"]["secretName"])
                obj = find(objs, kind, ref) or find(made, kind, ref)
                if obj is None:
                    # Made by the user (a multi-cluster mesh's remote secrets): any key.
                    return (kind, ref) in MADE_OUTSIDE and (kind, ref) not in {(o["kind"], o["metadata"]["name"]) for o in made}
                return key in (obj.get("data") or {}) or key in (obj.get("stringData") or {})
            if "projected" in v:
                return any(s.get("serviceAccountToken", {}).get("path") == key for s in v["projected"]["sources"])
            return True  # emptyDir, hostPath: made at run time
        return False

    for o in workloads(objs):
        for ct in pod_spec(o)["containers"]:
            paths = [a.split("=", 1)[1].split("=")[-1] for a in ct.get("args", []) if a.startswith("--") and "=" in a]
            paths = [p for p in paths if p.startswith("/etc/") or p.startswith("/var/run/secrets/")]
            if o is node and ct is n:
                paths += [v for k, v in NODE_DEFAULT_FILES.items() if flag(n, k) is None]
            for p in paths:
                check(resolvable(o, ct, p, MADE), f"{name}: {o['metadata']['name']}/{ct['name']} finds {p} in its volumes")

    # $(VAR) in args and env values: Kubernetes leaves an undefined one as written.
    for o in workloads(objs):
        for ct in pod_spec(o)["containers"]:
            defined, bad = [], []
            for e in ct.get("env", []):
                bad += [v for v in re.findall(r"\$\((\w+)\)", e.get("value") or "") if v not in defined]
                defined.append(e["name"])
            for a in ct.get("args", []) + ct.get("command", []):
                bad += [v for v in re.findall(r"\$\((\w+)\)", a) if v not in defined]
            check(not bad, f"{name}: {o['metadata']['name']}/{ct['name']} defines every $(VAR) it uses", str(bad))

    # One image, the one kustomize sets.
    images = {ct["image"] for o in workloads(objs) for ct in pod_spec(o)["containers"]}
    check(len(images) == 1 and "/" in next(iter(images)), f"{name}: every container runs the one Ferry image ({', '.join(images)})")


MADE = []


def check_prepare(objs):
    want = {("Namespace", "ferry-system"): set(), ("Secret", "ferry-ca"): {"ca-cert.pem", "ca-key.pem"},
            ("ConfigMap", "ferry-ca-root"): {"root-cert.pem"}, ("ConfigMap", "ferry-k8s-issuer"): {"issuer", "jwks.json"}}
    for (kind, name), keys in want.items():
        o = find(objs, kind, name)
        check(o is not None and keys <= set(o.get("data") or {}), f"prepare.sh: {kind} {name} with {sorted(keys) or 'no keys'}")


def check_remote_secret(objs, cluster):
    check(len(objs) == 1 and objs[0].get("kind") == "Secret", "remote-secret.sh: one Secret")
    s = objs[0]
    labels = s["metadata"].get("labels", {})
    check(s["metadata"].get("namespace") == "ferry-system",
          "remote-secret.sh: in ferry-system, where the overlays' control planes watch (--remote-secrets-namespace)")
    check(labels.get("istio/multiCluster") == "true", "remote-secret.sh: labelled istio/multiCluster: \"true\" (what the control plane requires)")
    data = s.get("stringData", {})
    check(list(data) == [cluster], f"remote-secret.sh: one key, the cluster ID {cluster}")
    kc = yaml.safe_load(data.get(cluster, "")) or {}
    users = [u.get("user", {}) for u in kc.get("users", [])]
    check(kc.get("kind") == "Config" and kc["clusters"][0]["cluster"].get("server") and users and users[0].get("token")
          and not any("exec" in u or "auth-provider" in u for u in users),
          "remote-secret.sh: a kubeconfig with a server and a token (no exec or auth provider, which the control plane refuses)")


# === flags ===


def option_env(text):
    """Each option of a clap --help text, with the environment variable it falls back to."""
    out, current = {}, None
    for line in text.splitlines():
        m = re.match(r"\s+(?:-\w, )?(--[\w-]+)", line)
        if m:
            current = m.group(1)
        e = re.search(r"\[env: (\w+)=", line)
        if e and current:
            out[current] = e.group(1)
    return out


def ferry_help(binary, words):
    r = subprocess.run([binary, *words, "--help"], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def check_flags(name, objs, binary):
    image_containers = [(o, ct) for o in workloads(objs) for ct in pod_spec(o)["containers"] if not ct.get("command")]
    for o, ct in image_containers:
        args = ct.get("args", [])
        words = []
        for a in args:
            if a.startswith("-"):
                break
            words.append(a)
        what = f"{name}: {o['metadata']['name']}/{ct['name']}: ferry {' '.join(words)}"
        code, text = ferry_help(binary, words)
        if code != 0:
            first = text.strip().splitlines()[0] if text.strip() else f"exit {code}"
            if tuple(words) in PENDING_COMMANDS:
                print(f"pending: {what}: this binary has no such command yet ({first})")
            else:
                fail(f"{what}: the binary has no such command ({first})")
            continue
        flags = [a.split("=", 1)[0] for a in args if a.startswith("--")]
        unknown = [f for f in flags if not re.search(r"(?<![\w-])" + re.escape(f) + r"(?![\w-])", text)]
        check(not unknown, f"{what}: its flags are the binary's", f"unknown {unknown}")
        usage = next((line for line in text.splitlines() if line.startswith("Usage:")), "")
        required = re.findall(r"(--[\w-]+) <", usage.split("[OPTIONS]")[-1])
        env_of = option_env(text)
        env = {e["name"] for e in ct.get("env", [])}
        unset = [f for f in required if f not in flags and env_of.get(f) not in env]
        check(not unset, f"{what}: every required flag is given or set from its environment", f"missing {unset}")
        if words == ["node"]:
            for f, path in NODE_DEFAULT_FILES.items():
                check(re.search(re.escape(f) + r" <[^>]*>\s*\n.*?\[default: " + re.escape(path) + r"\]", text) is not None,
                      f"{what}: {f} defaults to {path}, which the pod mounts")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--kubernetes", default="1.30,1.37")
    ap.add_argument("--ferry")
    ap.add_argument("--flags-only", action="store_true")
    ap.add_argument("--remote-cluster", default="cluster2")
    args = ap.parse_args()
    renders = sorted(f for f in os.listdir(args.dir) if f.endswith(".yaml") and f not in ("prepare.yaml", "remote-secret.yaml"))
    global MADE
    prepare = os.path.join(args.dir, "prepare.yaml")
    MADE = load(prepare) if os.path.exists(prepare) else []
    for f in renders:
        objs = load(os.path.join(args.dir, f))
        name = f[: -len(".yaml")]
        steps = [] if args.flags_only else [
            lambda: check_schema(name, objs, args.kubernetes.split(",")),
            lambda: check_shape(name, objs),
            lambda: check_rbac(name, objs),
            lambda: check_cni_rbac(name, objs),
            lambda: check_remote_secrets(name, objs),
            lambda: check_lease(name, objs),
        ]
        if args.ferry:
            steps.append(lambda: check_flags(name, objs, args.ferry))
        for step in steps:
            try:
                step()
            except Exception as e:  # a manifest too broken to check further is a failure
                fail(f"{name}: could not check further: {type(e).__name__}: {e}")
    if not args.flags_only:
        if MADE:
            check_schema("prepare", MADE, args.kubernetes.split(","))
            check_prepare(MADE)
        rs = os.path.join(args.dir, "remote-secret.yaml")
        if os.path.exists(rs):
            objs = load(rs)
            check_schema("remote-secret", objs, args.kubernetes.split(","))
            check_remote_secret(objs, args.remote_cluster)
    print(f"manifests: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
