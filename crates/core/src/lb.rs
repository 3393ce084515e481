//! Load balancing over candidates that already passed scope and reachability filters.
//!
//! Istio's semantics: a candidate's *rank* is the number of leading routing preferences it
//! shares with the source (comparison stops at the first that differs). `Strict` keeps only
//! candidates that match every preference; `Failover` keeps the best rank present; `Standard`
//! keeps all. Unhealthy candidates are skipped unless the health policy allows them, terminating
//! ones always, and the choice among the survivors is random, weighted by capacity.

use serde::Serialize;

use crate::model::{
    ClusterId, Health, HealthPolicy, LbMode, LoadBalancing, Locality, LocalityScope, NetworkId,
    NodeName,
};
use crate::random::Random;

/// Where a candidate (or the source) runs.
#[derive(Clone, Copy, Debug)]
pub struct Placement<'a> {
    pub cluster: &'a ClusterId,
    pub network: &'a NetworkId,
    pub node: Option<&'a NodeName>,
    pub locality: &'a Locality,
}

/// One endpoint as load balancing sees it.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    pub placement: Placement<'a>,
    pub health: Health,
    pub capacity: u32,
}

/// Why load balancing set a candidate aside.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum LbDrop {
    Unhealthy,
    /// Terminating: no new connections, whatever the health policy.
    Terminating,
    NoCapacity,
    /// Matched `rank` of `of` routing preferences; a closer candidate exists, or strict mode.
    LessPreferred {
        rank: usize,
        of: usize,
    },
}

/// The outcome of one choice: the index picked (if any) and what was set aside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub picked: Option<usize>,
    pub rank: usize,
    pub dropped: Vec<(usize, LbDrop)>,
}

/// The number of leading preferences `c` shares with `src`.
pub fn rank(prefs: &[LocalityScope], src: &Placement<'_>, c: &Placement<'_>) -> usize {
    prefs
        .iter()
        .take_while(|p| match p {
            LocalityScope::Network => src.network == c.network,
            LocalityScope::Cluster => src.cluster == c.cluster,
            LocalityScope::Region => src.locality.region == c.locality.region,
            LocalityScope::Zone => src.locality.zone == c.locality.zone,
            LocalityScope::Subzone => src.locality.subzone == c.locality.subzone,
            LocalityScope::Node => src.node.is_some() && src.node == c.node,
        })
        .count()
}

/// Picks one of `candidates` for a source at `src`.
pub fn choose(
    lb: &LoadBalancing,
    src: &Placement<'_>,
    candidates: &[Candidate<'_>],
    rng: &mut dyn Random,
) -> Choice {
    let mut dropped = Vec::new();
    let mut live: Vec<(usize, usize)> = Vec::with_capacity(candidates.len());
    for (i, c) in candidates.iter().enumerate() {
        if c.health == Health::Terminating {
            dropped.push((i, LbDrop::Terminating));
        } else if c.health == Health::Unhealthy && lb.health_policy == HealthPolicy::OnlyHealthy {
            dropped.push((i, LbDrop::Unhealthy));
        } else if c.capacity == 0 {
            dropped.push((i, LbDrop::NoCapacity));
        } else {
            live.push((i, rank(&lb.routing_preference, src, &c.placement)));
        }
    }
    let of = lb.routing_preference.len();
    let wanted = match lb.mode {
        LbMode::Standard => None,
        LbMode::Strict => Some(of),
        LbMode::Failover => live.iter().map(|(_, r)| *r).max(),
    };
    if let Some(wanted) = wanted {
        live.retain(|&(i, r)| {
            let keep = r == wanted;
            if !keep {
                dropped.push((i, LbDrop::LessPreferred { rank: r, of }));
            }
            keep
        });
    }
    dropped.sort_by_key(|(i, _)| *i);
    let rank = live.first().map(|(_, r)| *r).unwrap_or(0);
    let total: u64 = live
        .iter()
        .map(|(i, _)| u64::from(candidates[*i].capacity))
        .sum();
    if total == 0 {
        return Choice {
            picked: None,
            rank,
            dropped,
        };
    }
    let mut ticket = rng.below(total);
    for (i, _) in &live {
        let w = u64::from(candidates[*i].capacity);
        if ticket < w {
            return Choice {
                picked: Some(*i),
                rank,
                dropped,
            };
        }
        ticket -= w;
    }
    unreachable!("ticket below the total weight always lands on a candidate")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::SplitMix64;

    fn loc(region: &str, zone: &str, subzone: &str) -> Locality {
        Locality {
            region: region.into(),
            zone: zone.into(),
            subzone: subzone.into(),
        }
    }

    /// A placement in `c` on `n`, on no node.
    fn at<'a>(c: &'a ClusterId, n: &'a NetworkId, locality: &'a Locality) -> Placement<'a> {
        Placement {
            cluster: c,
            network: n,
            node: None,
            locality,
        }
    }

    fn candidate(placement: Placement<'_>, health: Health, capacity: u32) -> Candidate<'_> {
        Candidate {
            placement,
            health,
            capacity,
        }
    }

    #[test]
    fn capacity_weights_the_choice() {
        let c = ClusterId::from("c");
        let n = NetworkId::from("n");
        let l = Locality::default();
        let p = at(&c, &n, &l);
        let cands = [
            candidate(p, Health::Healthy, 1),
            candidate(p, Health::Healthy, 3),
        ];
        let mut rng = SplitMix64::new(1);
        let mut counts = [0u32; 2];
        for _ in 0..4000 {
            counts[choose(&LoadBalancing::standard(), &p, &cands, &mut rng)
                .picked
                .unwrap()] += 1;
        }
        // Expected 1000 / 3000; a wide margin keeps this a behaviour check, not a flaky one.
        assert!((800..1200).contains(&counts[0]), "{counts:?}");
    }

    #[test]
    fn strict_mode_refuses_partial_matches() {
        let c = ClusterId::from("c");
        let n = NetworkId::from("n");
        let here = loc("r1", "z1", "");
        let there = loc("r1", "z2", "");
        let src = at(&c, &n, &here);
        let far = at(&c, &n, &there);
        let lb = LoadBalancing {
            mode: LbMode::Strict,
            routing_preference: vec![LocalityScope::Region, LocalityScope::Zone],
            health_policy: HealthPolicy::OnlyHealthy,
        };
        let cands = [candidate(far, Health::Healthy, 1)];
        let choice = choose(&lb, &src, &cands, &mut SplitMix64::new(1));
        assert_eq!(choice.picked, None);
        assert_eq!(
            choice.dropped,
            vec![(0, LbDrop::LessPreferred { rank: 1, of: 2 })]
        );
    }

    #[test]
    fn allow_all_health_policy_keeps_unhealthy() {
        let c = ClusterId::from("c");
        let n = NetworkId::from("n");
        let l = Locality::default();
        let p = at(&c, &n, &l);
        let cands = [candidate(p, Health::Unhealthy, 1)];
        let mut lb = LoadBalancing::standard();
        assert_eq!(
            choose(&lb, &p, &cands, &mut SplitMix64::new(1)).picked,
            None
        );
        lb.health_policy = HealthPolicy::AllowAll;
        assert_eq!(
            choose(&lb, &p, &cands, &mut SplitMix64::new(1)).picked,
            Some(0)
        );
    }

    #[test]
    fn a_terminating_candidate_is_never_picked_whatever_the_health_policy() {
        let c = ClusterId::from("c");
        let n = NetworkId::from("n");
        let l = Locality::default();
        let p = at(&c, &n, &l);
        let cands = [
            candidate(p, Health::Terminating, 100),
            candidate(p, Health::Healthy, 1),
        ];
        for policy in [HealthPolicy::OnlyHealthy, HealthPolicy::AllowAll] {
            let mut lb = LoadBalancing::standard();
            lb.health_policy = policy;
            for seed in 0..50 {
                let choice = choose(&lb, &p, &cands, &mut SplitMix64::new(seed));
                assert_eq!(choice.picked, Some(1), "{policy:?}, seed {seed}");
                assert_eq!(choice.dropped, vec![(0, LbDrop::Terminating)]);
            }
            let alone = &cands[..1];
            assert_eq!(
                choose(&lb, &p, alone, &mut SplitMix64::new(1)).picked,
                None,
                "{policy:?}: a terminating endpoint is no fallback"
            );
        }
    }
}
