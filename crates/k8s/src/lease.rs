//! Leader election over a `coordination.k8s.io/v1` Lease in the local cluster, for the writes
//! only one control-plane replica should make: the `ServiceImport`s that keep the cluster-set
//! addresses Ferry allocates, and the `ServiceExport`s' `Conflict` conditions. Every replica
//! keeps watching, translating and serving xDS; only the Lease's holder writes.
//!
//! The algorithm is client-go's `leaderelection` (kube-rs 5 has no leader election;
//! `kube-leader-election` needs kube 4, and `kube-lease-manager` takes an expired Lease with
//! patches that are not conditional on what it read, so two replicas can both believe they
//! took it):
//! - Every write of the Lease is conditional: a create when there is none (`409
//!   AlreadyExists` if another replica created it first), else a replace carrying the
//!   `resourceVersion` last read (`409 Conflict` if it changed since). Of two replicas that try
//!   at once, one wins.
//! - A replica takes the Lease when it has no holder, or when its holder has not renewed it for
//!   [`LeaseConfig::duration`], measured on this replica's clock from when it saw the Lease
//!   change: the times written in the Lease (other machines' clocks) are never compared.
//! - The holder renews it every [`LeaseConfig::retry_period`] and stops writing once
//!   [`LeaseConfig::renew_deadline`] (shorter than the duration) has passed since its last
//!   successful renewal began, so it has stopped before another replica may take over.
//!
//! The decision is [`step`], pure; [`elect`] does the I/O.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

/// Which Lease, who this replica is, and how long a claim lasts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's identity, unique among the replicas (its pod's name).
    pub identity: String,
    /// How long another replica waits after it last saw the Lease change before taking it.
    pub duration: Duration,
    /// How long the holder keeps writing without a successful renewal (below `duration`).
    pub renew_deadline: Duration,
    /// How often the Lease is tried: renewed by its holder, read by the others.
    pub retry_period: Duration,
}

/// A [`LeaseConfig`] whose durations cannot elect safely.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "lease {namespace}/{name}: {what} (duration {duration:?}, renew deadline {renew_deadline:?}, retry period {retry_period:?})"
)]
pub struct LeaseConfigError {
    namespace: String,
    name: String,
    what: &'static str,
    duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
}

impl LeaseConfig {
    /// `namespace/name`, held as `identity` for `duration`; renewed every sixth of it, the
    /// holder stepping down after two thirds of it without a renewal (client-go's defaults
    /// are 15 s, 10 s and 2 s).
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
        duration: Duration,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            duration,
            renew_deadline: duration * 2 / 3,
            retry_period: duration / 6,
        }
    }

    /// The durations elect one holder at a time: `0 < retry period < renew deadline <
    /// duration`, and a non-empty identity.
    pub fn check(&self) -> Result<(), LeaseConfigError> {
        let what = if self.identity.is_empty() {
            Some("no identity")
        } else if self.retry_period.is_zero() {
            Some("the retry period is zero")
        } else if self.retry_period >= self.renew_deadline {
            Some("the retry period must be shorter than the renew deadline")
        } else if self.renew_deadline >= self.duration {
            Some(
                "the renew deadline must be shorter than the duration (else two replicas may write at once)",
            )
        } else if self.duration > Duration::from_secs(i32::MAX as u64) {
            Some("the duration is too long")
        } else {
            None
        };
        match what {
            None => Ok(()),
            Some(what) => Err(LeaseConfigError {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                what,
                duration: self.duration,
                renew_deadline: self.renew_deadline,
                retry_period: self.retry_period,
            }),
        }
    }
}

/// What this replica knows of the election.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Leadership {
    /// This replica's identity.
    pub identity: String,
    /// This replica holds the Lease: it writes.
    pub leading: bool,
    /// The holder last read from the Lease.
    pub holder: Option<String>,
    /// Why the last try failed, if it did.
    pub last_error: Option<String>,
}

/// The Lease as last read, and when this replica saw it change.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    lease: Lease,
    since: Instant,
}

impl Seen {
    fn holder(&self) -> Option<&str> {
        self.lease
            .spec
            .as_ref()?
            .holder_identity
            .as_deref()
            .filter(|h| !h.is_empty())
    }

    fn version(&self) -> Option<&str> {
        self.lease.metadata.resource_version.as_deref()
    }
}

/// What to do with the Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// There is none: create it, held by us.
    Create,
    /// We hold it: renew it.
    Renew,
    /// It is free or expired: take it.
    Take,
    /// Another replica holds it.
    Wait,
}

/// The step for `seen` (`None`: there is no Lease) at `now`. Pure.
pub(crate) fn step(seen: Option<&Seen>, identity: &str, duration: Duration, now: Instant) -> Step {
    let Some(seen) = seen else {
        return Step::Create;
    };
    match seen.holder() {
        Some(h) if h == identity => Step::Renew,
        None => Step::Take,
        Some(_) if now >= seen.since + duration => Step::Take,
        Some(_) => Step::Wait,
    }
}

/// Runs the election for `config` against `client`'s cluster until the task is dropped;
/// the receiver follows it. `config` should have passed [`LeaseConfig::check`].
pub fn elect(
    client: kube::Client,
    config: LeaseConfig,
) -> (watch::Receiver<Leadership>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(Leadership {
        identity: config.identity.clone(),
        ..Leadership::default()
    });
    let task = tokio::spawn(run(Api::namespaced(client, &config.namespace), config, tx));
    (rx, task)
}

async fn run(api: Api<Lease>, config: LeaseConfig, tx: watch::Sender<Leadership>) {
    let mut seen: Option<Seen> = None;
    // When the last successful write as holder began.
    let mut renewed: Option<Instant> = None;
    loop {
        let started = Instant::now();
        // A try never keeps a holder past its deadline, even if the API server hangs.
        let limit = renewed.unwrap_or(started) + config.renew_deadline;
        let tried = tokio::time::timeout_at(limit, attempt(&api, &config, &mut seen)).await;
        let last_error = match tried {
            Ok(Ok(true)) => {
                renewed = Some(started);
                None
            }
            Ok(Ok(false)) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!(
                "no answer within the renew deadline ({:?})",
                config.renew_deadline
            )),
        };
        let now = Instant::now();
        let holder = seen.as_ref().and_then(Seen::holder).map(str::to_string);
        if holder.as_deref() != Some(config.identity.as_str())
            || renewed.is_some_and(|r| now >= r + config.renew_deadline)
        {
            renewed = None;
        }
        let leading = renewed.is_some();
        tx.send_if_modified(|l| {
            if l.leading != leading {
                tracing::info!(lease = %format!("{}/{}", config.namespace, config.name), identity = %config.identity, leading, holder = ?holder, "leadership changed");
            }
            if let Some(e) = &last_error
                && l.last_error.as_ref() != Some(e)
            {
                tracing::warn!(lease = %format!("{}/{}", config.namespace, config.name), identity = %config.identity, error = %e, "could not read or write the lease; trying again");
            }
            let next = Leadership {
                identity: config.identity.clone(),
                leading,
                holder,
                last_error,
            };
            let changed = *l != next;
            *l = next;
            changed
        });
        let mut next = started + config.retry_period;
        if let Some(r) = renewed {
            next = next.min(r + config.renew_deadline);
        }
        tokio::time::sleep_until(next).await;
    }
}

/// Reads the Lease and takes the step it calls for; whether this replica now holds it.
async fn attempt(
    api: &Api<Lease>,
    config: &LeaseConfig,
    seen: &mut Option<Seen>,
) -> Result<bool, kube::Error> {
    let read = api.get_opt(&config.name).await?;
    let now = Instant::now();
    *seen = match (read, seen.take()) {
        (None, _) => None,
        // The same version: when it was first seen stands.
        (Some(lease), Some(old)) if old.version() == lease.metadata.resource_version.as_deref() => {
            Some(Seen {
                lease,
                since: old.since,
            })
        }
        (Some(lease), _) => Some(Seen { lease, since: now }),
    };
    let step = step(seen.as_ref(), &config.identity, config.duration, now);
    let written = match step {
        Step::Wait => return Ok(false),
        Step::Create => {
            api.create(&PostParams::default(), &claim(config, None, step))
                .await
        }
        Step::Renew | Step::Take => {
            api.replace(
                &config.name,
                &PostParams::default(),
                &claim(config, seen.as_ref(), step),
            )
            .await
        }
    };
    match written {
        Ok(lease) => {
            *seen = Some(Seen {
                lease,
                since: Instant::now(),
            });
            if step != Step::Renew {
                tracing::info!(lease = %format!("{}/{}", config.namespace, config.name), identity = %config.identity, "took the lease");
            }
            Ok(true)
        }
        // Another replica wrote it first.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The Lease held by `config.identity`, replacing `seen` (its resourceVersion: the write fails
/// if the Lease changed since).
fn claim(config: &LeaseConfig, seen: Option<&Seen>, step: Step) -> Lease {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let old = seen.and_then(|s| s.lease.spec.clone()).unwrap_or_default();
    let transitions = old.lease_transitions.unwrap_or(0);
    let mut metadata = seen.map(|s| s.lease.metadata.clone()).unwrap_or_default();
    metadata.name = Some(config.name.clone());
    metadata.namespace = Some(config.namespace.clone());
    Lease {
        metadata,
        spec: Some(LeaseSpec {
            holder_identity: Some(config.identity.clone()),
            // Whole seconds, rounded up: what other clients (kubectl, client-go) read.
            lease_duration_seconds: Some(
                i32::try_from(config.duration.as_millis().div_ceil(1000)).unwrap_or(i32::MAX),
            ),
            acquire_time: match step {
                Step::Renew => old.acquire_time.or_else(|| Some(now.clone())),
                _ => Some(now.clone()),
            },
            renew_time: Some(now),
            lease_transitions: Some(match step {
                Step::Take => transitions.saturating_add(1),
                _ => transitions,
            }),
            ..old
        }),
    }
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;

    use super::*;

    fn seen(holder: Option<&str>, since: Instant) -> Seen {
        Seen {
            lease: Lease {
                metadata: ObjectMeta {
                    resource_version: Some("7".into()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: holder.map(str::to_string),
                    ..LeaseSpec::default()
                }),
            },
            since,
        }
    }

    #[test]
    fn the_step_follows_the_holder_and_the_time_since_the_lease_last_changed() {
        let t0 = Instant::now();
        let d = Duration::from_secs(15);
        let later = |s: u64| t0 + Duration::from_secs(s);
        let cases: [(&str, Option<Seen>, Instant, Step); 7] = [
            ("no lease", None, t0, Step::Create),
            ("ours", Some(seen(Some("a"), t0)), later(100), Step::Renew),
            ("no holder", Some(seen(None, t0)), t0, Step::Take),
            ("an empty holder", Some(seen(Some(""), t0)), t0, Step::Take),
            (
                "another's, fresh",
                Some(seen(Some("b"), t0)),
                later(14),
                Step::Wait,
            ),
            (
                "another's, expired",
                Some(seen(Some("b"), t0)),
                later(15),
                Step::Take,
            ),
            (
                "another's, long expired",
                Some(seen(Some("b"), t0)),
                later(60),
                Step::Take,
            ),
        ];
        for (what, s, now, want) in cases {
            assert_eq!(step(s.as_ref(), "a", d, now), want, "{what}");
        }
    }

    #[test]
    fn a_claim_renews_or_takes_the_lease_it_read() {
        let config = LeaseConfig::new(
            "ferry-system",
            "ferry-control",
            "a",
            Duration::from_millis(1500),
        );
        let read = seen(Some("b"), Instant::now());
        let mut read_lease = read.lease.clone();
        read_lease.spec.as_mut().unwrap().lease_transitions = Some(3);
        let read = Seen {
            lease: read_lease,
            since: read.since,
        };
        let taken = claim(&config, Some(&read), Step::Take);
        assert_eq!(
            taken.metadata.resource_version.as_deref(),
            Some("7"),
            "conditional on the version read"
        );
        assert_eq!(taken.metadata.name.as_deref(), Some("ferry-control"));
        let spec = taken.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(
            spec.lease_transitions,
            Some(4),
            "a new holder is a transition"
        );
        assert_eq!(
            spec.lease_duration_seconds,
            Some(2),
            "whole seconds, rounded up"
        );
        assert!(spec.acquire_time.is_some() && spec.renew_time.is_some());
        let renewed = claim(&config, Some(&read), Step::Renew).spec.unwrap();
        assert_eq!(
            renewed.lease_transitions,
            Some(3),
            "a renewal is not a transition"
        );
        let created = claim(&config, None, Step::Create);
        assert_eq!(created.metadata.resource_version, None);
        assert_eq!(created.spec.unwrap().lease_transitions, Some(0));
    }

    #[test]
    fn durations_that_could_elect_two_holders_are_refused() {
        let ok = LeaseConfig::new("ns", "l", "a", Duration::from_secs(15));
        assert_eq!(ok.check(), Ok(()));
        assert_eq!(
            (ok.renew_deadline, ok.retry_period),
            (Duration::from_secs(10), Duration::from_millis(2500))
        );
        let bad = |f: fn(&mut LeaseConfig)| {
            let mut c = ok.clone();
            f(&mut c);
            c.check().unwrap_err().to_string()
        };
        assert!(
            bad(|c| c.renew_deadline = c.duration)
                .contains("renew deadline must be shorter than the duration")
        );
        assert!(
            bad(|c| c.retry_period = c.renew_deadline).contains("retry period must be shorter")
        );
        assert!(bad(|c| c.retry_period = Duration::ZERO).contains("retry period is zero"));
        assert!(bad(|c| c.identity.clear()).contains("no identity"));
        assert!(bad(|c| c.duration = Duration::ZERO).starts_with("lease ns/l: "));
    }
}
