//! With Kubernetes, the agent keeps its pods in line with their labels while they run: after
//! every change the watch sees (and whenever a node proxy has taken the replay, or the plugin's
//! add enrolled a pod), it plans ([`enroll::plan`]) and carries out the enrollments and
//! removals over ZDS, then writes each pod's `ambient.istio.io/redirection` annotation to say
//! what it did ([`enroll::annotations`]). A pod asked into the mesh that the plugin never told of
//! (it started before the agent, or while the agent was down) is found by its IP among the
//! network namespaces of the node's processes ([`discover`]) and handed over the same way.
//! Whatever failed (a pod's namespace not found, no node proxy took a pod, the API server
//! refused a patch) is tried again on the next change, or after a backoff.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::discover::{self, Found, Wanted};
use super::enroll::{self, Action, Entry};
use super::kube::Watch;
use super::pods::{Kept, Pod, uid};
use super::zds::Op;
use super::{Agent, info};
use crate::spec::PodRef;

/// The first and the longest wait before trying a failed step again.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MOST: Duration = Duration::from_secs(30);

/// The pods looked for among the node's network namespaces and not found, with their IPs then,
/// and when to look again: not on every change the watch sees (most are about other pods), but
/// at once for a pod newly wanted or whose IPs changed, else after a wait that doubles while the
/// same pods stay missing (from [`RETRY_FIRST`] up to [`RETRY_MOST`]).
#[derive(Debug, Default)]
pub(super) struct Missing {
    pods: BTreeMap<String, Vec<IpAddr>>,
    next: Option<tokio::time::Instant>,
    wait: Duration,
}

impl Missing {
    /// Whether to scan for `wanted` at `now`.
    fn due(&self, wanted: &[Wanted], now: tokio::time::Instant) -> bool {
        wanted.iter().any(|w| self.pods.get(&w.key) != Some(&w.ips))
            || self.next.is_none_or(|next| now >= next)
    }

    /// After a scan at `now` that left `missing` not found.
    fn scanned(&mut self, missing: BTreeMap<String, Vec<IpAddr>>, now: tokio::time::Instant) {
        if missing.is_empty() {
            *self = Self::default();
            return;
        }
        self.wait = if missing == self.pods {
            (self.wait * 2).clamp(RETRY_FIRST, RETRY_MOST)
        } else {
            RETRY_FIRST
        };
        self.next = Some(now + self.wait);
        self.pods = missing;
    }

    fn warned(&self, key: &str) -> bool {
        self.pods.contains_key(key)
    }
}

/// Reconciles after every change until the task is dropped.
pub(super) async fn follow(agent: Arc<Agent>, watch: Arc<Watch>) {
    let mut changes = watch.subscribe();
    let mut delay = RETRY_FIRST;
    loop {
        changes.borrow_and_update();
        if agent.reconcile(&watch).await {
            tokio::select! {
                r = changes.changed() => if r.is_err() { return },
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(RETRY_MOST);
        } else {
            delay = RETRY_FIRST;
            if changes.changed().await.is_err() {
                return;
            }
        }
    }
}

impl Agent {
    /// The pods the plugin told of.
    fn entries(&self) -> Vec<Entry> {
        let state = self.state.lock();
        state
            .pods
            .iter()
            .map(|(key, p)| Entry {
                key: key.clone(),
                pod: p.kept.pod.clone(),
                enrolled: p.netns.is_some(),
            })
            .collect()
    }

    /// One pass; whether something failed and is to be tried again.
    async fn reconcile(&self, watch: &Watch) -> bool {
        let entries = self.entries();
        let Some(actions) = watch.view(self.flags(), |v| enroll::plan(v, &entries)) else {
            return false;
        };
        let mut retry = false;
        let mut unknown = Vec::new();
        for a in actions {
            match a {
                Action::Unknown { pod, ips } => unknown.push((pod, ips)),
                a => retry |= self.carry(a).await,
            }
        }
        retry |= self.adopt(unknown).await;
        let entries = self.entries();
        let changes = watch
            .view(self.flags(), |v| enroll::annotations(v, &entries))
            .unwrap_or_default();
        for c in changes {
            if let Err(e) = watch.annotate(&c).await {
                tracing::warn!(k8s.namespace = %c.namespace, k8s.name = %c.name, error = %e, "the pod's annotation could not be written; trying again");
                retry = true;
            }
        }
        retry
    }

    /// Carries out one action; whether it failed and is to be tried again.
    async fn carry(&self, action: Action) -> bool {
        match action {
            Action::Enroll { key } => self.enroll_running(&key).await,
            Action::Unenroll { key, why } => {
                if self.release(&key, false).await {
                    tracing::info!(pod = %key, reason = %why, "running pod left the mesh");
                }
                false
            }
            Action::Forget { key } => {
                if self.release(&key, true).await {
                    tracing::info!(pod = %key, "pod gone from the API server: released and forgotten");
                }
                false
            }
            // Looked for by [`Agent::adopt`].
            Action::Unknown { .. } => false,
        }
    }

    /// Finds the network namespaces of the pods asked into the mesh that the plugin never told
    /// of (they started before the agent, or while it was down) by their IPs ([`discover`]),
    /// and hands them to the node proxy; whether one was not found, to be looked for again.
    async fn adopt(&self, unknown: Vec<(PodRef, Vec<IpAddr>)>) -> bool {
        // A pod without an IP is still being set up: the plugin will tell of it.
        let wanted: Vec<(PodRef, Wanted)> = unknown
            .into_iter()
            .filter(|(_, ips)| !ips.is_empty())
            .map(|(pod, ips)| {
                let key = uid(&pod, "");
                (pod, Wanted { key, ips })
            })
            .collect();
        if wanted.is_empty() {
            *self.missing.lock() = Missing::default();
            return false;
        }
        let started = tokio::time::Instant::now();
        let looked_for: Vec<Wanted> = wanted.iter().map(|(_, w)| w.clone()).collect();
        if !self.missing.lock().due(&looked_for, started) {
            // The same pods, still missing: looked for again when the wait is over.
            return true;
        }
        let seen = match discover::scan(&self.config.proc_dir).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "the node's processes could not be listed to find pods that started before the agent; trying again");
                return true;
            }
        };
        tracing::info!(
            pods = wanted.len(),
            namespaces = seen.len(),
            scan_ms = started.elapsed().as_millis() as u64,
            "looked for pods that started before the agent among the node's network namespaces"
        );
        let found = discover::matches(&seen, &looked_for);
        let mut retry = false;
        let mut missing = BTreeMap::new();
        for (pod, w) in wanted {
            let Some(Found::At { path, inode }) = found.get(&w.key) else {
                let why = found.get(&w.key).map(ToString::to_string);
                if !self.missing.lock().warned(&w.key) {
                    tracing::warn!(pod = %w.key, k8s.namespace = %pod.namespace, k8s.name = %pod.name, ips = ?w.ips, reason = why.as_deref().unwrap_or_default(), "asked into the mesh, but the pod's network namespace was not found; looking again");
                }
                missing.insert(w.key, w.ips);
                continue;
            };
            tracing::info!(pod = %w.key, k8s.namespace = %pod.namespace, k8s.name = %pod.name, netns = %path.display(), inode, "a pod that started before the agent: its network namespace found by its IP");
            {
                let mut state = self.state.lock();
                if state.pods.get(&w.key).is_none() {
                    let kept = Kept {
                        pod,
                        container_id: String::new(),
                        netns: path.clone(),
                        inode: Some(*inode),
                        uncaptured: Vec::new(),
                    };
                    state.pods.insert(w.key.clone(), Pod { kept, netns: None });
                }
            }
            self.save();
            retry |= self.enroll_running(&w.key).await;
        }
        retry |= !missing.is_empty();
        // Each warned of once while it stays so.
        self.missing.lock().scanned(missing, started);
        retry
    }

    /// Hands a running pod the agent knows (its namespace's path) to the node proxy.
    async fn enroll_running(&self, key: &str) -> bool {
        let Some(kept) = self
            .state
            .lock()
            .pods
            .get(key)
            .filter(|p| p.netns.is_none())
            .map(|p| p.kept.clone())
        else {
            return false;
        };
        let file = match kept.open() {
            Ok(f) => Arc::new(f),
            Err(e) => {
                tracing::warn!(pod = %key, netns = %kept.netns.display(), error = %e, "the pod's network namespace is gone; forgetting the pod");
                self.state.lock().pods.remove(key);
                self.save();
                return false;
            }
        };
        let (done, outcome) = oneshot::channel();
        {
            let mut state = self.state.lock();
            let super::State { pods, node } = &mut *state;
            let Some(pod) = pods.get_mut(key).filter(|p| p.netns.is_none()) else {
                return false;
            };
            let Some(node) = node else {
                tracing::info!(pod = %key, "asked into the mesh; enrolled once a node proxy connects");
                return false;
            };
            let op = Op::Add {
                uid: key.to_string(),
                info: info(&pod.kept.pod),
                uncaptured: pod.kept.uncaptured.clone(),
                netns: file.clone(),
                done,
            };
            if node.ops.send(op).is_err() {
                return true;
            }
            pod.netns = Some(file.clone());
        }
        self.save();
        let failed = match outcome.await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some("the node proxy went away".to_string()),
        };
        let Some(e) = failed else {
            tracing::info!(pod = %key, "running pod enrolled: its labels ask for the mesh");
            return false;
        };
        {
            let mut state = self.state.lock();
            if let Some(p) = state.pods.get_mut(key)
                && p.netns.as_ref().is_some_and(|n| Arc::ptr_eq(n, &file))
            {
                p.netns = None;
            }
        }
        self.save();
        tracing::warn!(pod = %key, error = %e, "the node proxy did not take the pod; trying again");
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(key: &str, ip: &str) -> Wanted {
        Wanted {
            key: key.into(),
            ips: vec![ip.parse().unwrap()],
        }
    }

    fn left(ws: &[&Wanted]) -> BTreeMap<String, Vec<IpAddr>> {
        ws.iter().map(|w| (w.key.clone(), w.ips.clone())).collect()
    }

    #[test]
    fn a_pod_that_stays_missing_is_looked_for_after_a_doubling_wait_not_on_every_change() {
        let t0 = tokio::time::Instant::now();
        let a = wanted("a", "198.18.0.1");
        let mut m = Missing::default();
        assert!(m.due(std::slice::from_ref(&a), t0), "never looked for: now");
        m.scanned(left(&[&a]), t0);
        assert!(m.warned("a"));
        // Changes that leave it as it was: not before the wait is over.
        assert!(!m.due(std::slice::from_ref(&a), t0));
        assert!(!m.due(std::slice::from_ref(&a), t0 + RETRY_FIRST / 2));
        assert!(m.due(std::slice::from_ref(&a), t0 + RETRY_FIRST));
        // Still missing: each wait twice the one before, up to the longest.
        let mut now = t0 + RETRY_FIRST;
        let mut waits = Vec::new();
        for _ in 0..10 {
            m.scanned(left(&[&a]), now);
            let next = m.next.unwrap();
            waits.push(next - now);
            assert!(!m.due(std::slice::from_ref(&a), next - Duration::from_millis(1)));
            now = next;
        }
        assert_eq!(waits[0], RETRY_FIRST * 2);
        assert_eq!(waits[1], RETRY_FIRST * 4);
        assert_eq!(*waits.last().unwrap(), RETRY_MOST);
        // A pod newly wanted, or its IPs changed: looked for at once.
        let b = wanted("b", "198.18.0.2");
        assert!(m.due(&[a.clone(), b.clone()], now));
        let a_moved = wanted("a", "198.18.0.3");
        assert!(m.due(std::slice::from_ref(&a_moved), now));
        // Another set missing starts from the shortest wait; none missing forgets.
        m.scanned(left(&[&a, &b]), now);
        assert_eq!(m.next.unwrap() - now, RETRY_FIRST);
        m.scanned(BTreeMap::new(), now);
        assert!(!m.warned("a") && m.due(std::slice::from_ref(&a), now));
    }
}
