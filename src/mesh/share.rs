//! Budget shares: how the nodes split one key's global budget without a master.
//!
//! A share is a fixed-point fraction of the budget (`ONE` = the whole budget). The rule that
//! keeps the cluster under its limit is that the shares of all nodes sum to at most `ONE`
//! in every round, which holds because
//! - a node may lower its share whenever it likes (never below what it already used), and
//! - a node may raise it only by claiming "room" (`ONE` minus every share), computed from
//!   the previous round's announcements of *every* member, which all claimers of a round
//!   therefore see alike; the room is split among the claimers in proportion to their
//!   deficit (target minus share), so the claims of one round sum to at most the room.
//!
//! Targets follow demand (the Flow Proportional Share idea of DRL, without a master): each
//! node gets a small floor plus a part of the rest proportional to its announced demand.
//! Everything here is a pure function of integers, so every node computes the same result
//! from the same announcements.

/// A share of a key's budget, in units of `1 / ONE`.
pub type Share = u32;

/// The whole budget.
pub const ONE: Share = 1 << 19;

/// Convert a fraction in `0.0..=1.0` into a share (clamped).
pub fn from_fraction(fraction: f64) -> Share {
    (fraction.clamp(0.0, 1.0) * f64::from(ONE)).round() as Share
}

/// Convert a share into a fraction of the budget.
pub fn to_fraction(share: Share) -> f64 {
    f64::from(share) / f64::from(ONE)
}

/// Return `floor(share · amount / ONE)`: the tokens a share of `amount` allows.
#[inline]
pub fn tokens_of(share: Share, amount: u64) -> u64 {
    ((u128::from(share) * u128::from(amount)) >> 19) as u64
}

/// Return the smallest share whose [`tokens_of`] `amount` is at least `tokens`.
pub fn share_for(tokens: u64, amount: u64) -> Share {
    if amount == 0 || tokens >= amount {
        return ONE;
    }
    let share = (u128::from(tokens) << 19).div_ceil(u128::from(amount)) as Share;
    share.min(ONE)
}

/// What one member announced for a key in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Announced {
    /// Its share.
    pub share: Share,
    /// Its demand: offered cost per round averaged over about 16 rounds, in sixteenths.
    pub demand: u32,
    /// Bucket tokens it released in that round.
    pub released: u32,
}

/// The inputs of one node's share update for one key.
#[derive(Debug, Clone, Copy)]
pub struct ShareRules {
    /// The least share of every live member (so that new demand is never starved).
    pub floor: Share,
    /// The most a node may add to its share in one round.
    pub max_claim: Share,
    /// What the whole budget serves in one round, in sixteenths of a token (the unit of
    /// announced demand): `16 · limit · round / window`, or `16 · rate · round`.
    pub round_budget: u64,
}

/// Return `demand` after `rounds` rounds without new demand: each round keeps 15/16 of it
/// (rounded down), which is the demand average's own decay. Every node applies the same
/// integer steps, so a quiet member need not re-announce a decaying demand.
pub fn decayed(demand: u32, rounds: u64) -> u32 {
    let mut d = demand;
    for _ in 0..rounds.min(512) {
        if d == 0 {
            break;
        }
        d = d - d.div_ceil(16);
    }
    if rounds > 512 { 0 } else { d }
}

/// Return the share that serves twice a member's announced demand.
pub fn need(rules: &ShareRules, a: &Announced) -> Share {
    let need = (u128::from(a.demand) * 2 * u128::from(ONE)) / u128::from(rules.round_budget.max(1));
    need.min(u128::from(ONE)) as Share
}

/// Tell whether member `j` is short: its share is below its need and its target.
fn is_short(rules: &ShareRules, live: &[Announced], j: usize, targets: &[Share]) -> bool {
    let a = &live[j];
    a.share < need(rules, a) && targets[j] > a.share
}

/// Compute every live member's target share from announcements of one round.
///
/// A member *needs* the share that serves twice its demand. When the needs fit in the
/// budget (`ONE - held`, `held` being the share of dead members whose admissions may still
/// count), each member's target is its need plus an even part of what is left, so every
/// member keeps headroom; when they do not fit, targets are a floor plus a part of the rest
/// proportional to demand (max-min fairness is not attempted). Targets sum to at most the
/// budget.
pub fn targets(rules: &ShareRules, live: &[Announced], held: u64, out: &mut Vec<Share>) {
    out.clear();
    let n = live.len() as u64;
    if n == 0 {
        return;
    }
    let available = u64::from(ONE).saturating_sub(held);
    let needs: u64 = live.iter().map(|a| u64::from(need(rules, a))).sum();
    if needs <= available {
        let spare = (available - needs) / n;
        out.extend(
            live.iter()
                .map(|a| (u64::from(need(rules, a)) + spare) as Share),
        );
        return;
    }
    let floor = u64::from(rules.floor).min(available / n);
    let spread = available - floor * n;
    let total_demand: u64 = live.iter().map(|a| u64::from(a.demand)).sum();
    for a in live {
        let part = if total_demand == 0 {
            spread / n
        } else {
            ((u128::from(spread) * u128::from(a.demand)) / u128::from(total_demand)) as u64
        };
        out.push((floor + part) as Share);
    }
}

/// Compute node `me`'s share for this round from the previous round's announcements.
///
/// - `live[me]` is this node's own previous announcement; `live` holds every live member's.
/// - `used` is the least share this node must keep: what it has already admitted and may
///   still count (a window's estimate); a node never drops below it.
/// - `consistent` says whether every live member's previous round is known and all agree
///   on the membership; only then may the node claim room.
pub fn next_share(
    rules: &ShareRules,
    live: &[Announced],
    me: usize,
    held: u64,
    used: Share,
    consistent: bool,
    scratch: &mut Vec<Share>,
) -> Share {
    targets(rules, live, held, scratch);
    let current = live[me].share;
    let target = scratch[me];
    let total: u64 = live.iter().map(|a| u64::from(a.share)).sum::<u64>() + held;
    let one = u64::from(ONE);
    if total > one {
        // Over-subscribed (after a heal or a rejoin): everyone shaves in proportion.
        let excess = total - one;
        let shave =
            (u128::from(excess) * u128::from(current)).div_ceil(u128::from(total.max(1))) as u64;
        // The allowance may drop below what is in use (the node then admits nothing until
        // its usage decays; it still announces its usage), or the excess would never end.
        let lowered = u64::from(current).saturating_sub(shave) as Share;
        return lowered.min(target.max(used.min(lowered)));
    }
    if target <= current {
        // Release down to the target (never below what is in use), but only when another
        // member is short: shares stay put while everyone has what it needs, so a quiet
        // cluster announces nothing.
        let someone_short = (0..live.len()).any(|j| j != me && is_short(rules, live, j, scratch));
        return if someone_short {
            target.max(used.min(current))
        } else {
            current
        };
    }
    if !consistent {
        return current;
    }
    current + claim_of(rules, live, me, total, scratch)
}

/// Return member `j`'s claim given the targets in `targets` and the shares' `total`.
fn claim_of(
    rules: &ShareRules,
    live: &[Announced],
    j: usize,
    total: u64,
    targets: &[Share],
) -> Share {
    let one = u64::from(ONE);
    if total >= one || !is_short(rules, live, j, targets) {
        return 0;
    }
    let room = one - total;
    let deficits: u64 = (0..live.len())
        .filter(|&k| is_short(rules, live, k, targets))
        .map(|k| u64::from(targets[k] - live[k].share))
        .sum();
    let deficit = u64::from(targets[j] - live[j].share);
    let fair = ((u128::from(room) * u128::from(deficit)) / u128::from(deficits.max(1))) as u64;
    deficit.min(fair).min(u64::from(rules.max_claim)) as Share
}

/// Tell whether nothing would change for anyone: the shares fit and nobody is short (with
/// `targets` computed for `live` and `held`).
pub fn is_settled(rules: &ShareRules, live: &[Announced], held: u64, targets: &[Share]) -> bool {
    let total: u64 = live.iter().map(|a| u64::from(a.share)).sum::<u64>() + held;
    total <= u64::from(ONE)
        && targets.len() == live.len()
        && !(0..live.len()).any(|j| is_short(rules, live, j, targets))
}

/// Return the sum of every live member's claim in a round (what each would add if its view
/// is complete): every member computes the same sum from the same announcements.
pub fn total_claims(
    rules: &ShareRules,
    live: &[Announced],
    held: u64,
    scratch: &mut Vec<Share>,
) -> u64 {
    targets(rules, live, held, scratch);
    let total: u64 = live.iter().map(|a| u64::from(a.share)).sum::<u64>() + held;
    (0..live.len())
        .map(|j| u64::from(claim_of(rules, live, j, total, scratch)))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: ShareRules = ShareRules {
        floor: ONE / 500,
        max_claim: ONE / 4,
        round_budget: 16 * 20,
    };

    fn a(share: Share, demand: u32) -> Announced {
        Announced {
            share,
            demand,
            released: 0,
        }
    }

    #[test]
    fn claims_of_one_round_never_exceed_the_room() {
        let live = [a(ONE / 5, 100), a(ONE / 5, 0), a(ONE / 10, 300), a(0, 50)];
        let mut scratch = Vec::new();
        let next: Vec<Share> = (0..live.len())
            .map(|i| next_share(&RULES, &live, i, 0, 0, true, &mut scratch))
            .collect();
        let total: u64 = next.iter().map(|&s| u64::from(s)).sum();
        assert!(total <= u64::from(ONE), "{next:?}");
        // The idle node released, the busy ones grew.
        assert!(next[1] < ONE / 5);
        assert!(next[2] > ONE / 10);
    }

    #[test]
    fn a_node_never_releases_below_what_it_uses() {
        let live = [a(ONE / 2, 0), a(ONE / 2, 100)];
        let mut scratch = Vec::new();
        let used = ONE / 3;
        assert_eq!(
            next_share(&RULES, &live, 0, 0, used, true, &mut scratch),
            used
        );
    }

    #[test]
    fn an_inconsistent_view_never_claims() {
        let live = [a(ONE / 10, 100), a(ONE / 10, 0)];
        let mut scratch = Vec::new();
        assert_eq!(
            next_share(&RULES, &live, 0, 0, 0, false, &mut scratch),
            ONE / 10
        );
        assert!(next_share(&RULES, &live, 0, 0, 0, true, &mut scratch) > ONE / 10);
    }

    #[test]
    fn over_subscription_shaves_every_share() {
        let live = [a(ONE / 2, 10), a(ONE / 2, 10), a(ONE / 4, 10)];
        let mut scratch = Vec::new();
        for i in 0..3 {
            assert!(next_share(&RULES, &live, i, 0, 0, true, &mut scratch) < live[i].share);
        }
    }

    #[test]
    fn token_arithmetic_rounds_the_safe_way() {
        assert_eq!(tokens_of(ONE, 1000), 1000);
        assert_eq!(tokens_of(ONE / 3, 1000), 333);
        let s = share_for(334, 1000);
        assert!(tokens_of(s, 1000) >= 334);
        assert!(tokens_of(s - 1, 1000) < 334);
    }
}
