//! Load balancing over candidates that already passed scope and reachability filters.
//!
//! Istio's semantics: a candidate's *rank* is the number of leading routing preferences it
//! shares with the source (comparison stops at the first that differs). `Strict` keeps only
//! candidates that match every preference; `Failover` keeps the best rank present; `Standard`
//! keeps all. Unhealthy candidates are skipped unless the health policy allows them, terminating
//! ones always, and the choice among the survivors is random, weighted by capacity.
//!
//! Ferry's graduated failover (`Failover` with a [`FailoverMinimum`]): the candidates form tiers
//! by rank, best first. A tier's health is the share it has of the minimum (usable endpoints, or
//! usable capacity against all of the tier's); it takes that share of what the better tiers left,
//! and the rest spills on. If all tiers together fall short, their shares are scaled up to the
//! whole. A draw picks the tier, then capacity picks within it. Every tier holds only candidates
//! that passed the scope filters, so a spill never leaves the scope.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::{
    ClusterId, FailoverMinimum, Health, HealthPolicy, LbMode, LoadBalancing, Locality,
    LocalityScope, NetworkId, NodeName,
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
    /// Graduated failover: in the tier that matched `rank` of `of` preferences, and this
    /// connection's draw went to another tier (see [`Choice::tiers`] for the shares).
    OtherTier {
        rank: usize,
        of: usize,
    },
}

/// One locality tier under graduated failover: what it has and the share of new connections it
/// takes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TierShare {
    /// How many routing preferences the tier's endpoints share with the source.
    pub rank: usize,
    /// Endpoints that may take a new connection, and their capacity.
    pub usable: u32,
    pub usable_capacity: u64,
    /// The capacity of every endpoint in the tier: usable, unhealthy, terminating, ejected.
    pub capacity: u64,
    /// The share of new connections, in parts per million.
    pub share_ppm: u32,
}

/// The outcome of one choice: the index picked (if any) and what was set aside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub picked: Option<usize>,
    pub rank: usize,
    pub dropped: Vec<(usize, LbDrop)>,
    /// The tiers and their shares, best first, when graduated failover decided; else empty.
    pub tiers: Vec<TierShare>,
}

/// Parts per million: the unit of a tier's share.
const WHOLE: u64 = 1_000_000;

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
    choose_among(lb, src, candidates, &[], rng)
}

/// [`choose`], told of the endpoints set aside before balancing (`absent`: ejected by outlier
/// detection, or failed earlier on this connection). They are never picked, but under graduated
/// failover they still count toward their tier's capacity, so losing them makes the tier spill.
pub fn choose_among(
    lb: &LoadBalancing,
    src: &Placement<'_>,
    candidates: &[Candidate<'_>],
    absent: &[Candidate<'_>],
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
    let mut tiers = Vec::new();
    let wanted = match (lb.mode, lb.failover_minimum) {
        (LbMode::Standard, _) => None,
        (LbMode::Strict, _) => Some(of),
        (LbMode::Failover, None) => live.iter().map(|(_, r)| *r).max(),
        (LbMode::Failover, Some(min)) => {
            tiers = shares(lb, src, candidates, absent, &live, min);
            draw(&tiers, rng)
        }
    };
    if let Some(wanted) = wanted {
        let graduated = !tiers.is_empty();
        live.retain(|&(i, r)| {
            let keep = r == wanted;
            if !keep {
                dropped.push((
                    i,
                    if graduated {
                        LbDrop::OtherTier { rank: r, of }
                    } else {
                        LbDrop::LessPreferred { rank: r, of }
                    },
                ));
            }
            keep
        });
    }
    dropped.sort_by_key(|(i, _)| *i);
    let rank = live.first().map(|(_, r)| *r).unwrap_or(0);
    let weights = live.iter().map(|(i, _)| u64::from(candidates[*i].capacity));
    let picked = pick_weighted(weights, rng).map(|k| live[k].0);
    Choice {
        picked,
        rank,
        dropped,
        tiers,
    }
}

/// The tiers of a graduated failover, best first, with the share each takes: a tier's health is
/// what it has of `min` (at most all of it); each tier takes its health of what the better tiers
/// left; if all together fall short, the shares are scaled up to the whole.
fn shares(
    lb: &LoadBalancing,
    src: &Placement<'_>,
    candidates: &[Candidate<'_>],
    absent: &[Candidate<'_>],
    live: &[(usize, usize)],
    min: FailoverMinimum,
) -> Vec<TierShare> {
    let mut by_rank: BTreeMap<usize, TierShare> = BTreeMap::new();
    fn tier(by_rank: &mut BTreeMap<usize, TierShare>, r: usize) -> &mut TierShare {
        by_rank.entry(r).or_insert(TierShare {
            rank: r,
            usable: 0,
            usable_capacity: 0,
            capacity: 0,
            share_ppm: 0,
        })
    }
    for c in candidates.iter().chain(absent) {
        let r = rank(&lb.routing_preference, src, &c.placement);
        tier(&mut by_rank, r).capacity += u64::from(c.capacity);
    }
    for &(i, r) in live {
        let t = tier(&mut by_rank, r);
        t.usable += 1;
        t.usable_capacity += u64::from(candidates[i].capacity);
    }
    let mut tiers: Vec<TierShare> = by_rank.into_values().rev().collect();
    let health = |t: &TierShare| -> u64 {
        let h = match min {
            FailoverMinimum::Endpoints(n) => u64::from(t.usable) * WHOLE / u64::from(n.max(1)),
            FailoverMinimum::Percent(p) if t.capacity > 0 => {
                t.usable_capacity * WHOLE * 100 / (t.capacity * u64::from(p.max(1)))
            }
            FailoverMinimum::Percent(_) => 0,
        };
        h.min(WHOLE)
    };
    let mut left = WHOLE;
    let mut raw = Vec::with_capacity(tiers.len());
    for t in &tiers {
        let s = health(t).min(left);
        left -= s;
        raw.push(s);
    }
    let sum = WHOLE - left;
    for (t, s) in tiers.iter_mut().zip(raw) {
        let scaled = (s * WHOLE).checked_div(sum).unwrap_or(0);
        t.share_ppm = u32::try_from(scaled).unwrap_or(u32::MAX);
    }
    tiers
}

/// The rank of the tier this connection's draw lands in; `None` when no tier has a share.
fn draw(tiers: &[TierShare], rng: &mut dyn Random) -> Option<usize> {
    pick_weighted(tiers.iter().map(|t| u64::from(t.share_ppm)), rng).map(|k| tiers[k].rank)
}

/// The index of one of `weights`, drawn in proportion to them; `None` when all are 0.
fn pick_weighted(
    weights: impl Iterator<Item = u64> + Clone,
    rng: &mut dyn Random,
) -> Option<usize> {
    let total: u64 = weights.clone().sum();
    if total == 0 {
        return None;
    }
    let mut ticket = rng.below(total);
    for (k, w) in weights.enumerate() {
        if ticket < w {
            return Some(k);
        }
        ticket -= w;
    }
    unreachable!("a ticket below the total weight always lands on a weight")
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
            failover_minimum: None,
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

    /// A source in zone z1 and a failover policy on zone with graduated minimum `min`; the
    /// candidates `near` (z1) and `far` (z2) as (health, capacity).
    fn graduated(
        min: FailoverMinimum,
        near: &[(Health, u32)],
        far: &[(Health, u32)],
        absent_near: u32,
        seeds: u64,
    ) -> (Vec<TierShare>, [u64; 2]) {
        let c = ClusterId::from("c");
        let n = NetworkId::from("n");
        let (z1, z2) = (loc("r", "z1", ""), loc("r", "z2", ""));
        let (here, there) = (at(&c, &n, &z1), at(&c, &n, &z2));
        let lb = LoadBalancing {
            mode: LbMode::Failover,
            routing_preference: vec![LocalityScope::Zone],
            health_policy: HealthPolicy::OnlyHealthy,
            failover_minimum: Some(min),
        };
        let mut cands = Vec::new();
        for &(h, cap) in near {
            cands.push(candidate(here, h, cap));
        }
        for &(h, cap) in far {
            cands.push(candidate(there, h, cap));
        }
        let absent: Vec<_> = (0..absent_near)
            .map(|_| candidate(here, Health::Healthy, 1))
            .collect();
        let mut rng = SplitMix64::new(7);
        let mut counts = [0u64; 2];
        let mut tiers = Vec::new();
        for _ in 0..seeds {
            let choice = choose_among(&lb, &here, &cands, &absent, &mut rng);
            tiers = choice.tiers;
            if let Some(i) = choice.picked {
                counts[usize::from(i >= near.len())] += 1;
            }
        }
        (tiers, counts)
    }

    fn shares_of(tiers: &[TierShare]) -> Vec<(usize, u32)> {
        tiers.iter().map(|t| (t.rank, t.share_ppm)).collect()
    }

    const UP: (Health, u32) = (Health::Healthy, 1);
    const DOWN: (Health, u32) = (Health::Unhealthy, 1);

    #[test]
    fn a_tier_with_its_minimum_takes_everything() {
        let (tiers, counts) = graduated(
            FailoverMinimum::Endpoints(2),
            &[UP, UP, DOWN],
            &[UP, UP],
            0,
            500,
        );
        assert_eq!(shares_of(&tiers), vec![(1, 1_000_000), (0, 0)]);
        assert_eq!(counts, [500, 0]);
    }

    #[test]
    fn a_tier_below_its_minimum_spills_in_proportion() {
        // One usable of a minimum of 2: half stays, half spills to the next tier.
        let (tiers, counts) = graduated(
            FailoverMinimum::Endpoints(2),
            &[UP, DOWN, DOWN],
            &[UP, UP],
            0,
            4000,
        );
        assert_eq!(shares_of(&tiers), vec![(1, 500_000), (0, 500_000)]);
        assert!((1800..2200).contains(&counts[0]), "{counts:?}");
        assert_eq!(tiers[0].usable, 1);
        assert_eq!(tiers[0].capacity, 3);
        // A minimum of 4 with one usable: a quarter stays.
        let (tiers, _) = graduated(
            FailoverMinimum::Endpoints(4),
            &[UP, DOWN, DOWN],
            &[UP, UP, UP, UP],
            0,
            1,
        );
        assert_eq!(shares_of(&tiers), vec![(1, 250_000), (0, 750_000)]);
    }

    #[test]
    fn an_empty_tier_spills_everything_and_all_tiers_short_share_the_whole() {
        let (tiers, counts) =
            graduated(FailoverMinimum::Endpoints(2), &[DOWN, DOWN], &[UP], 0, 300);
        assert_eq!(shares_of(&tiers), vec![(1, 0), (0, 1_000_000)]);
        assert_eq!(counts, [0, 300]);
        // 1/4 and 1/4 of a minimum of 4: together half of it, scaled up to the whole.
        let (tiers, _) = graduated(FailoverMinimum::Endpoints(4), &[UP, DOWN], &[UP], 0, 1);
        assert_eq!(shares_of(&tiers), vec![(1, 500_000), (0, 500_000)]);
        // Nothing usable anywhere: no pick.
        let (tiers, counts) = graduated(FailoverMinimum::Endpoints(1), &[DOWN], &[DOWN], 0, 10);
        assert_eq!(shares_of(&tiers), vec![(1, 0), (0, 0)]);
        assert_eq!(counts, [0, 0]);
    }

    #[test]
    fn a_percentage_minimum_counts_capacity_and_endpoints_set_aside_before() {
        // Capacity 1 usable of 4 against a minimum of 50%: health 1/2.
        let (tiers, _) = graduated(
            FailoverMinimum::Percent(50),
            &[(Health::Healthy, 1), (Health::Unhealthy, 3)],
            &[UP],
            0,
            1,
        );
        assert_eq!(shares_of(&tiers), vec![(1, 500_000), (0, 500_000)]);
        // Two usable and two ejected (absent) of a minimum of 100%: half, though every
        // candidate the balancer sees is healthy.
        let (tiers, _) = graduated(FailoverMinimum::Percent(100), &[UP, UP], &[UP], 2, 1);
        assert_eq!(shares_of(&tiers), vec![(1, 500_000), (0, 500_000)]);
        assert_eq!(tiers[0].capacity, 4);
    }

    #[test]
    fn terminating_endpoints_count_as_lost_capacity_and_are_never_picked() {
        let term = (Health::Terminating, 1);
        let (tiers, counts) = graduated(FailoverMinimum::Percent(100), &[UP, term], &[UP], 0, 2000);
        assert_eq!(shares_of(&tiers), vec![(1, 500_000), (0, 500_000)]);
        assert!((800..1200).contains(&counts[0]), "{counts:?}");
    }

    #[test]
    fn the_minimum_is_checked() {
        assert!(FailoverMinimum::Endpoints(0).check().is_err());
        assert!(FailoverMinimum::Percent(0).check().is_err());
        assert!(FailoverMinimum::Percent(101).check().is_err());
        assert_eq!(
            FailoverMinimum::Percent(100).check(),
            Ok(FailoverMinimum::Percent(100))
        );
    }
}
