//! Who is in the cluster. MLX fixes a group's ranks when it forms, cannot tell who is there
//! before, and keeps a broken group for the life of the process, so rank 0 keeps a roster
//! beside it: every worker checks in on rank 0's roster port (one line of JSON each way), rank
//! 0 tells them when to form and with whom, and a machine gone for longer than `--drop-after`
//! is left out of the next cluster when the model fits on the others: every rank renumbers
//! from the same list. MLX carries everything else.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::hostfile::HostFile;
use super::identity::NodeIdentity;
use super::link_watch::{Post, Watch};
use super::presence::{self, Departure};

/// The environment entry that hands a restarted rank 0 the machines it forms with.
pub const MEMBERSHIP_VAR: &str = "FASTMLX_CLUSTER_MEMBERS";
/// After a take-in: the list that served before, which rank 0 falls back to if the larger
/// cluster cannot form.
pub const FALLBACK_VAR: &str = "FASTMLX_CLUSTER_FALLBACK";
/// Machines whose take-in failed: not taken back before a time (`place:unix seconds:failures`,
/// comma-separated).
pub const HOLD_VAR: &str = "FASTMLX_CLUSTER_HOLD";
/// How long a machine whose take-in failed is served without at first; each failure after
/// doubles it, up to [`MAX_HOLD`].
pub const HOLD_OFF: Duration = Duration::from_secs(300);
const MAX_HOLD: Duration = Duration::from_secs(4 * 3600);
/// A check-in older than this and the machine counts as gone (many polls: one slow exchange
/// does not make a machine look gone).
pub const FRESH: Duration = Duration::from_secs(5);
/// How often a worker checks in while it waits for its turn.
const POLL: Duration = Duration::from_millis(250);
/// The most a check-in may take (either side).
const EXCHANGE: Duration = Duration::from_secs(2);
/// What rank 0 says on a present worker's connection once every member is present: this word,
/// then the address of the link post the worker is to watch (its right neighbour's), if any.
const FORM_NOW: &str = "form";
/// What rank 0 says to a parked worker when a step follows (with the park's number).
pub const WAKE: &str = "wake";
/// How long a present worker waits to be told to form before it checks in again.
const FORM_WAIT: Duration = Duration::from_secs(20);
/// How long a probe of a neighbour's MLX address may take.
pub const PROBE_WITHIN: Duration = Duration::from_millis(1500);
/// Check-ins answered at once; more connections wait in the port's queue.
const AT_ONCE: usize = 32;

/// The machines the cluster is made of: their places in the host file, in rank order (rank 0
/// first). A new list gets a higher generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    pub generation: u64,
    pub members: Vec<usize>,
}

impl Membership {
    /// Every machine of the host file.
    pub fn everyone(hosts: &HostFile) -> Membership {
        Membership { generation: 0, members: (0..hosts.ranks.len()).collect() }
    }

    /// The rank of the machine at `place` in the host file, if it is a member.
    pub fn rank_of(&self, place: usize) -> Option<usize> {
        self.members.iter().position(|&p| p == place)
    }

    /// The host file of this cluster: the members' addresses, in its rank order.
    pub fn hosts(&self, file: &HostFile) -> HostFile {
        HostFile { ranks: self.members.iter().map(|&p| file.ranks[p].clone()).collect() }
    }

    /// The places of the host file left out.
    pub fn left_out(&self, file: &HostFile) -> Vec<usize> {
        (0..file.ranks.len()).filter(|p| !self.members.contains(p)).collect()
    }

    /// This list with `places` added (a new generation), in host-file order.
    pub fn with(&self, places: &[usize]) -> Membership {
        let mut members: Vec<usize> = self.members.iter().chain(places).copied().collect();
        members.sort_unstable();
        members.dedup();
        Membership { generation: self.generation + 1, members }
    }

    /// For [`MEMBERSHIP_VAR`]: `generation:place,place,...`.
    pub fn to_env(&self) -> String {
        let places: Vec<String> = self.members.iter().map(usize::to_string).collect();
        format!("{}:{}", self.generation, places.join(","))
    }

    /// The list in the environment entry `var` ([`MEMBERSHIP_VAR`], [`FALLBACK_VAR`]), if
    /// there is one that fits `hosts`.
    pub fn from_var(var: &str, hosts: &HostFile) -> Option<Membership> {
        Membership::parse(&std::env::var(var).ok()?, hosts)
    }

    /// The list a restarted rank 0 was handed, if it fits `hosts` (starts with 0, places in it).
    fn parse(text: &str, hosts: &HostFile) -> Option<Membership> {
        let (generation, places) = text.split_once(':')?;
        let members: Vec<usize> = places.split(',').map(|p| p.parse().ok()).collect::<Option<_>>()?;
        let valid = members.first() == Some(&0)
            && members.windows(2).all(|w| w[0] < w[1])
            && members.iter().all(|&p| p < hosts.ranks.len());
        valid.then_some(Membership { generation: generation.parse().ok()?, members })
    }
}

/// The place in the host file of the group's `rank`, given the members' `places` in rank order
/// (none given: the group is the host file).
pub fn place_of(places: &[usize], rank: usize) -> usize {
    places.get(rank).copied().unwrap_or(rank)
}

/// Names the machine at `place` as people know it: its rank in the host file and its address.
pub fn name(hosts: &HostFile, place: usize) -> String {
    format!("rank {place} ({})", hosts.ranks.get(place).map(|a| a.join(", ")).unwrap_or_default())
}

/// A worker's check-in.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CheckIn {
    /// Its place in the host file (its `--rank`).
    place: usize,
    /// Its room for weights, in bytes.
    room: u64,
    /// Its version, model and settings: a machine that differs is refused here, before it
    /// could stop a serving cluster to be taken in.
    identity: NodeIdentity,
    /// What keeps it from joining now (MLX cannot listen at its address): it is there, but the
    /// cluster does not form with it until it checks in without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    problem: Option<String>,
    /// A member told to form: its connection stays open, with a heartbeat, for as long as it
    /// serves ([`presence`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    present: bool,
    /// Whether it reached its right neighbour's MLX addresses, as rank 0 last asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reached: Option<Reached>,
    /// A present member's link post: the port its left neighbour watches it on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    post: Option<u16>,
}

/// A worker's probe of the addresses MLX will connect it to ([`super::mlx_address::reach`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Reached {
    addresses: Vec<String>,
    /// Why it could not reach them; none if it did.
    error: Option<String>,
}

/// Rank 0's answer.
#[derive(Debug, Serialize, Deserialize)]
struct Answer {
    membership: Membership,
    /// The members form the cluster now.
    form: bool,
    /// Why this worker cannot join (another version, model or settings): it stops.
    #[serde(default)]
    refused: Option<String>,
    /// A member's right neighbour's MLX addresses, which it is to check that it reaches.
    #[serde(default)]
    probe: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    at: Instant,
    room: u64,
}

struct State {
    membership: Membership,
    form: bool,
    /// Rank 0 decides whom to form with (holding its own addresses): members are asked to
    /// probe their right neighbours.
    probing: bool,
    /// Each place's last check-in ready to join (rank 0's own is never needed).
    seen: Vec<Option<Seen>>,
    /// Each place's problem as it last checked in with one (cleared by a check-in without).
    problems: Vec<Option<(Instant, String)>>,
    /// Since when rank 0 has listened: the clock of a machine never heard from.
    opened: Instant,
    /// Machines whose take-in failed, each held off until its own time.
    holds: Holds,
    /// Each member's presence that ended since this rank 0 started, and how.
    departures: Vec<Option<(Instant, Departure)>>,
    /// Each place's latest probe of its right neighbour (rank 0's its own).
    reached: Vec<Option<(Instant, Reached)>>,
    /// Since when each place's probes of its right neighbour's addresses have failed, without
    /// one that got through.
    unreached_since: Vec<Option<Instant>>,
    /// Since when each place has checked in without a gap (a machine not reached is counted
    /// gone from its arrival at the earliest, not from probes made while it was away).
    arrived: Vec<Option<Instant>>,
    /// Each member present now (told to form, its addresses let go): where rank 0 tells it
    /// that every member is, and MLX starts.
    present: Vec<Option<TcpStream>>,
    /// Each present member's link post.
    posts: Vec<Option<u16>>,
    /// Each place whose link to its right neighbour is down, since when and why.
    links_down: Vec<Option<(Instant, String)>>,
}

impl State {
    /// The MLX addresses the member at `place` connects to: its right neighbour's in the ring.
    fn right_of(&self, hosts: &HostFile, place: usize) -> Option<(usize, Vec<String>)> {
        let members = &self.membership.members;
        let rank = self.membership.rank_of(place)?;
        let next = *members.get((rank + 1) % members.len()).filter(|_| members.len() > 1)?;
        Some((next, hosts.ranks[next].clone()))
    }
}

impl State {
    /// Where the member at `place` finds its right neighbour's link post (rank 0's is
    /// `own_post`), if it has one.
    fn right_post(&self, hosts: &HostFile, place: usize, own_post: Option<u16>) -> Option<String> {
        let (next, addresses) = self.right_of(hosts, place)?;
        let port = if next == 0 { own_post } else { self.posts[next] };
        super::link_watch::address(addresses.first()?, port?)
    }

    /// The probe `place` made of its right neighbour's addresses, noted with since when such
    /// probes have failed.
    fn note_reached(&mut self, place: usize, reached: Reached) {
        let now = Instant::now();
        let same = self.reached[place].as_ref().is_some_and(|(_, r)| r.addresses == reached.addresses);
        self.unreached_since[place] = match (&reached.error, self.unreached_since[place]) {
            (None, _) => None,
            (Some(_), Some(since)) if same => Some(since),
            (Some(_), _) => Some(now),
        };
        self.reached[place] = Some((now, reached));
    }

    /// The member to leave out for the links that cannot be made (each place's probe of its
    /// right neighbour failing lately, on the ring as it stands), since when, and what is said
    /// of it. One machine at a time, the ring that is left probed anew: the one in the most
    /// failing links (a machine whose cable is gone fails both of its own), else the one not
    /// reached; never rank 0. Its clock starts at its arrival at the earliest. Links to or from
    /// a machine `missing` count for nothing: that one is waited for on its own account.
    fn cut_off(&self, hosts: &HostFile, now: Instant, missing: &[usize]) -> Option<(usize, Instant, String)> {
        let mut links = Vec::new();
        for &place in self.membership.members.iter().filter(|p| !missing.contains(p)) {
            let Some((next, addresses)) = self.right_of(hosts, place) else { continue };
            if missing.contains(&next) {
                continue;
            }
            let Some((at, reached)) = &self.reached[place] else { continue };
            let (Some(error), Some(since)) = (&reached.error, self.unreached_since[place]) else { continue };
            if now.duration_since(*at) < FRESH && reached.addresses == addresses {
                links.push((place, next, since, error.clone()));
            }
        }
        let involved = |p: usize| links.iter().filter(|l| l.0 == p || l.1 == p).count();
        let blamed = links
            .iter()
            .flat_map(|l| [l.1, l.0])
            .filter(|&p| p != 0)
            .max_by_key(|&p| (involved(p), std::cmp::Reverse(links.iter().position(|l| l.0 == p))))?;
        let own: Vec<_> = links.iter().filter(|l| l.0 == blamed || l.1 == blamed).collect();
        let since = own.iter().map(|l| l.2).min()?.max(self.arrived[blamed].unwrap_or(now));
        let said: Vec<String> =
            own.iter().map(|(place, next, _, error)| format!("{}: {error}", link_name(hosts, *place, *next))).collect();
        Some((blamed, since, format!("{}: {}", name(hosts, blamed), said.join("; "))))
    }
}

impl State {
    /// The machines of the host file heard from lately that are not members and not held off.
    fn back(&self, now: Instant) -> Vec<usize> {
        let at = SystemTime::now();
        self.checked_in(now).filter(|&p| !self.holds.active(p, at)).collect()
    }

    /// The machines of the host file heard from lately that are not members but are held off,
    /// each with how long it still is: taken in only if a person asks.
    fn held(&self, now: Instant) -> Vec<(usize, Duration)> {
        let at = SystemTime::now();
        self.checked_in(now).filter(|&p| self.holds.active(p, at)).map(|p| (p, self.holds.remaining(p, at))).collect()
    }

    fn checked_in(&self, now: Instant) -> impl Iterator<Item = usize> + '_ {
        (1..self.seen.len()).filter(move |&p| !self.membership.members.contains(&p) && fresh(self, p, now))
    }
}

/// Machines whose take-in failed: each held off until its own time, the longer the more often
/// it failed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holds(Vec<(usize, SystemTime, u32)>);

impl Holds {
    /// The holds rank 0 was handed ([`HOLD_VAR`]); none if absent or unreadable.
    pub fn from_env() -> Holds {
        std::env::var(HOLD_VAR).ok().and_then(|text| Holds::parse(&text)).unwrap_or_default()
    }

    fn parse(text: &str) -> Option<Holds> {
        let entry = |e: &str| -> Option<(usize, SystemTime, u32)> {
            let mut parts = e.split(':');
            let place = parts.next()?.parse().ok()?;
            let until = UNIX_EPOCH + Duration::from_secs(parts.next()?.parse().ok()?);
            Some((place, until, parts.next()?.parse().ok()?))
        };
        text.split(',').filter(|e| !e.is_empty()).map(entry).collect::<Option<Vec<_>>>().map(Holds)
    }

    pub fn to_env(&self) -> String {
        let secs = |t: &SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        self.0.iter().map(|(p, until, n)| format!("{p}:{}:{n}", secs(until))).collect::<Vec<_>>().join(",")
    }

    /// Whether `place` is held off at `at`.
    pub fn active(&self, place: usize, at: SystemTime) -> bool {
        self.0.iter().any(|&(p, until, _)| p == place && at < until)
    }

    /// How long `place` is still held off at `at`.
    pub fn remaining(&self, place: usize, at: SystemTime) -> Duration {
        let until = self.0.iter().find(|h| h.0 == place).map_or(at, |h| h.1);
        until.duration_since(at).unwrap_or_default()
    }

    /// These holds but `places`'.
    pub fn without(&self, places: &[usize]) -> Holds {
        Holds(self.0.iter().copied().filter(|h| !places.contains(&h.0)).collect())
    }

    /// These holds with `places` failed once more at `at`: each held for [`HOLD_OFF`] doubled
    /// for every failure before (the others' kept as they are).
    pub fn failed(&self, places: &[usize], at: SystemTime) -> Holds {
        let mut holds = self.0.clone();
        for &place in places {
            let failures = holds.iter().find(|h| h.0 == place).map_or(0, |h| h.2) + 1;
            let hold = HOLD_OFF.saturating_mul(1 << (failures - 1).min(16)).min(MAX_HOLD);
            holds.retain(|h| h.0 != place);
            holds.push((place, at + hold, failures));
        }
        Holds(holds)
    }
}

/// What rank 0 does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Every member is there: form with them.
    Form(Membership),
    /// Why it waits (who is missing, for how long, what happens next).
    Wait(String),
}

/// What rank 0 does once a member is gone without a goodbye: given what is said of it.
type OnLost = Arc<Mutex<Option<Box<dyn Fn(String) + Send>>>>;

/// Rank 0's side: listens on its roster port, answers check-ins, and decides who forms.
#[derive(Clone)]
pub struct Roster {
    state: Arc<Mutex<State>>,
    hosts: HostFile,
    identity: Arc<NodeIdentity>,
    on_lost: OnLost,
    /// Rank 0's own MLX addresses, held while it waits to form (its left neighbour probes them).
    own: Arc<Mutex<Option<super::mlx_address::Held>>>,
    /// Rank 0's link post and its watch of rank 1's, from the forming on.
    own_links: Arc<Mutex<(Option<Post>, Option<Watch>)>>,
}

impl Roster {
    /// Listens on each of rank 0's hosts at `port`, starting from `membership`; a worker
    /// whose `identity` differs from rank 0's is refused with the reason.
    pub fn open(hosts: &HostFile, port: u16, membership: Membership, identity: NodeIdentity) -> Result<Roster, String> {
        let n = hosts.ranks.len();
        let (seen, problems, departures, reached) = (vec![None; n], vec![None; n], vec![None; n], vec![None; n]);
        let (holds, opened, present) = (Holds::from_env(), Instant::now(), (0..n).map(|_| None).collect());
        let (posts, links_down, unreached_since, arrived) =
            (vec![None; n], vec![None; n], vec![None; n], vec![None; n]);
        let state = State {
            membership,
            form: false,
            probing: false,
            seen,
            problems,
            opened,
            holds,
            departures,
            reached,
            unreached_since,
            arrived,
            present,
            posts,
            links_down,
        };
        let roster = Roster {
            state: Arc::new(Mutex::new(state)),
            hosts: hosts.clone(),
            identity: Arc::new(identity),
            on_lost: Arc::default(),
            own: Arc::default(),
            own_links: Arc::default(),
        };
        let answering = Arc::new(AtomicUsize::new(0));
        for address in roster_addresses(hosts, port) {
            let listener = TcpListener::bind(&address).map_err(|e| {
                format!("the cluster's roster cannot listen on {address} (choose another with --roster-port): {e}")
            })?;
            let (roster, answering) = (roster.clone(), answering.clone());
            std::thread::spawn(move || loop {
                let stream = match listener.accept() {
                    Ok((stream, _)) => stream,
                    // Out of descriptors, say: a pause rather than a spin.
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                };
                // Each check-in on a thread of its own, so a peer that stalls holds up no other;
                // past the limit a connection is closed unanswered (its worker asks again).
                if answering.fetch_add(1, Ordering::SeqCst) >= AT_ONCE {
                    answering.fetch_sub(1, Ordering::SeqCst);
                    continue;
                }
                let (roster, counter) = (roster.clone(), answering.clone());
                let spawned = std::thread::Builder::new().name("fastmlx-roster".into()).spawn(move || {
                    let mut counted = Some(counter);
                    let _ = roster.answer(stream, &mut counted);
                    if let Some(counter) = counted {
                        counter.fetch_sub(1, Ordering::SeqCst);
                    }
                });
                // No thread to be had: the connection closes unanswered and its worker asks again.
                if spawned.is_err() {
                    answering.fetch_sub(1, Ordering::SeqCst);
                }
            });
        }
        Ok(roster)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answers the check-in on `stream`; a member's presence is then attended for as long as it
    /// lasts, out of the count of check-ins answered at once (`counted`, given back first).
    fn answer(&self, stream: TcpStream, counted: &mut Option<Arc<AtomicUsize>>) -> std::io::Result<()> {
        stream.set_write_timeout(Some(EXCHANGE))?;
        let line = read_line_within(&stream, 4096, EXCHANGE)?;
        let check_in: CheckIn = serde_json::from_str(&line).map_err(std::io::Error::other)?;
        let (answer, present) = {
            let mut state = self.state();
            let refused = if check_in.place == 0 || check_in.place >= state.seen.len() {
                Some(format!("rank {} is not a worker of this host file", check_in.place))
            } else if let Some(why) = self.identity.mismatch(check_in.place, &check_in.identity) {
                Some(format!("the ranks do not match: {why}"))
            } else {
                let place = check_in.place;
                if let Some(reached) = check_in.reached.clone() {
                    state.note_reached(place, reached);
                }
                match check_in.problem {
                    Some(problem) => state.problems[place] = Some((Instant::now(), problem)),
                    None => {
                        if !fresh(&state, place, Instant::now()) {
                            // Back after a gap: its probes from before say nothing of now.
                            state.arrived[place] = Some(Instant::now());
                            state.unreached_since[place] = None;
                            if check_in.reached.is_none() {
                                state.reached[place] = None;
                            }
                        }
                        state.seen[place] = Some(Seen { at: Instant::now(), room: check_in.room });
                        state.problems[place] = None;
                    }
                }
                None
            };
            let member = state.membership.rank_of(check_in.place).is_some();
            let present = check_in.present && refused.is_none() && member;
            let asked = refused.is_none() && state.probing && !state.form;
            let probe = asked.then(|| state.right_of(&self.hosts, check_in.place)).flatten();
            let probe = probe.map(|(_, addresses)| addresses);
            (Answer { membership: state.membership.clone(), form: state.form, refused, probe }, present)
        };
        let mut text = serde_json::to_string(&answer).map_err(std::io::Error::other)?;
        text.push('\n');
        (&stream).write_all(text.as_bytes())?;
        if present {
            if let Some(counter) = counted.take() {
                counter.fetch_sub(1, Ordering::SeqCst);
            }
            {
                let mut state = self.state();
                state.present[check_in.place] = stream.try_clone().ok();
                state.posts[check_in.place] = check_in.post;
            }
            let departure = presence::attend(&stream, |link| self.link_said(check_in.place, link));
            self.departed(check_in.place, departure);
        }
        Ok(())
    }

    /// A member's presence ended: noted, and where it went without a goodbye (or at all, while
    /// the cluster forms), told to what rank 0 does then ([`Self::on_lost`]).
    fn departed(&self, place: usize, departure: Departure) {
        let said = departure.describe(&name(&self.hosts, place));
        let lost = {
            let mut state = self.state();
            // While the cluster forms, any member gone (one that gave up says why) fails it.
            let lost = (departure.unannounced() || state.form) && state.membership.rank_of(place).is_some();
            state.departures[place] = Some((Instant::now(), departure));
            state.present[place] = None;
            lost
        };
        eprintln!("rank 0: {said}");
        if lost {
            if let Some(on_lost) = &*self.on_lost.lock().unwrap_or_else(|e| e.into_inner()) {
                on_lost(said);
            }
        }
    }

    /// What the member at `place` says of its link to its right neighbour (why it is down, or
    /// `None`): a link that goes down is a rank lost, as a member gone is, named by the link.
    fn link_said(&self, place: usize, down: Option<String>) {
        let said = {
            let mut state = self.state();
            let Some((next, _)) = state.right_of(&self.hosts, place) else { return };
            let link = link_name(&self.hosts, place, next);
            match (down, state.links_down[place].is_some()) {
                (Some(why), false) => {
                    let said = format!("{link} (the link between them is down: {why})");
                    state.links_down[place] = Some((Instant::now(), said.clone()));
                    said
                }
                (None, true) => {
                    state.links_down[place] = None;
                    eprintln!("rank 0: {} reaches {} again", name(&self.hosts, place), name(&self.hosts, next));
                    return;
                }
                _ => return,
            }
        };
        eprintln!("rank 0: {said}");
        if let Some(on_lost) = &*self.on_lost.lock().unwrap_or_else(|e| e.into_inner()) {
            on_lost(said);
        }
    }

    /// What rank 0 does once a member is gone without a goodbye, or a link between two is down
    /// (the last given replaces the others): given what is said of it.
    pub fn on_lost(&self, on_lost: impl Fn(String) + Send + 'static) {
        *self.on_lost.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(on_lost));
    }

    /// What is said of the members gone without a goodbye, the first gone first; none if
    /// every member is present or left on its own.
    pub fn lost(&self) -> Option<String> {
        let state = self.state();
        let mut gone: Vec<(Instant, String)> = state
            .membership
            .members
            .iter()
            .filter_map(|&p| match &state.departures[p] {
                Some((at, d)) if d.unannounced() => Some((*at, d.describe(&name(&self.hosts, p)))),
                _ => None,
            })
            .chain(state.links_down.iter().flatten().cloned())
            .collect();
        gone.sort_by_key(|(at, _)| *at);
        (!gone.is_empty()).then(|| gone.into_iter().map(|(_, said)| said).collect::<Vec<_>>().join("; "))
    }

    /// What keeps rank 0 itself from forming the cluster (MLX cannot listen at its address);
    /// meanwhile its addresses are held, answering its left neighbour's probes.
    pub fn own_problem(&self) -> Option<String> {
        let mut own = self.own.lock().unwrap_or_else(|e| e.into_inner());
        if own.is_some() {
            return None;
        }
        match super::mlx_address::hold(&self.hosts.ranks[0]) {
            Ok(held) => {
                *own = Some(held);
                None
            }
            Err(why) => Some(format!("this machine, rank 0: {why}")),
        }
    }

    /// Rank 0's addresses let go, for MLX to bind.
    pub fn release_own(&self) {
        self.own.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// The host file.
    pub fn hosts(&self) -> &HostFile {
        &self.hosts
    }

    /// The workers of `membership` not yet present (told to form, their addresses let go),
    /// each with whether it has been silent too long to count as there: a member told to form
    /// checks in present at once, so one not heard from for [`FRESH`] is gone.
    pub fn absent(&self, membership: &Membership) -> Vec<(usize, bool)> {
        let state = self.state();
        let now = Instant::now();
        let absent = membership.members.iter().copied().skip(1).filter(|&p| state.present[p].is_none());
        absent.map(|p| (p, state.seen[p].is_none_or(|s| now.duration_since(s.at) >= FRESH))).collect()
    }

    /// Tells every present worker of `membership` that all are: each starts MLX now (no worker
    /// still holds its addresses or probes a neighbour's, so no connection of MLX's lands on a
    /// probe's listener, nor a probe on MLX's), and watches its right neighbour's link post from
    /// then on; rank 0 opens its own and watches rank 1's.
    pub fn tell_form(&self, membership: &Membership) -> Result<(), String> {
        let own_post = self.open_own_post();
        // Written with the state let go: a peer slow to take a line holds up no check-in.
        let told: Vec<(usize, Option<std::io::Result<TcpStream>>, String)> = {
            let state = self.state();
            let line = |place: usize| {
                let target = state.right_post(&self.hosts, place, own_post);
                format!("{FORM_NOW} {}\n", target.unwrap_or_default())
            };
            let streams = membership.members.iter().skip(1);
            streams.map(|&p| (p, state.present[p].as_ref().map(|s| s.try_clone()), line(p))).collect()
        };
        for (place, stream, line) in told {
            let told = stream.map(|stream| {
                let stream = stream?;
                stream.set_write_timeout(Some(EXCHANGE))?;
                (&stream).write_all(line.as_bytes())
            });
            match told {
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(format!("{} could not be told to form: {e}", name(&self.hosts, place))),
                None => return Err(format!("{} is not present to form", name(&self.hosts, place))),
            }
        }
        self.watch_own_link();
        Ok(())
    }

    /// Rank 0 about to send a step after parking the workers (`park`, the park's number): tells
    /// every present worker to wait on MLX's links again. A line on each presence connection,
    /// sent ahead of the step on the ring, which MLX's sockets hold until the worker takes it.
    pub fn wake(&self, park: u64) {
        let streams: Vec<(usize, std::io::Result<TcpStream>)> = {
            let state = self.state();
            let present = state.present.iter().enumerate().skip(1);
            present.filter_map(|(p, s)| Some((p, s.as_ref()?.try_clone()))).collect()
        };
        for (place, stream) in streams {
            let told = stream.and_then(|stream| {
                stream.set_write_timeout(Some(EXCHANGE))?;
                (&stream).write_all(format!("{WAKE} {park}\n").as_bytes())
            });
            // A worker that cannot be told is gone or going: its presence says so.
            if let Err(e) = told {
                tracing::warn!("{} could not be woken: {e}", name(&self.hosts, place));
            }
        }
    }

    /// Rank 0's link post, opened beside its first MLX address (its left neighbour watches it):
    /// its port, none if it could not be (that link then goes unwatched, as said).
    fn open_own_post(&self) -> Option<u16> {
        let mut links = self.own_links.lock().unwrap_or_else(|e| e.into_inner());
        if links.0.is_none() {
            match self.hosts.ranks[0].first().map(|a| Post::open(a)) {
                Some(Ok(post)) => links.0 = Some(post),
                Some(Err(why)) => eprintln!("rank 0: the link to this machine goes unwatched: {why}"),
                None => {}
            }
        }
        links.0.as_ref().map(Post::port)
    }

    /// Rank 0 watches its own link to rank 1, as the workers watch theirs.
    fn watch_own_link(&self) {
        let Some(target) = self.state().right_post(&self.hosts, 0, None) else { return };
        let roster = self.clone();
        let watch = Watch::start(target, move |down| roster.link_said(0, down));
        self.own_links.lock().unwrap_or_else(|e| e.into_inner()).1 = Some(watch);
    }

    /// Whether each member of `membership` reached its right neighbour lately (rank 0 through
    /// [`Self::probe_own_link`]): if not, why the cluster waits, naming the link.
    pub fn unreached(&self, membership: &Membership) -> Option<String> {
        let state = self.state();
        let now = Instant::now();
        let mut why = Vec::new();
        for &place in &membership.members {
            let Some((next, addresses)) = state.right_of(&self.hosts, place) else { continue };
            let link = link_name(&self.hosts, place, next);
            match &state.reached[place] {
                Some((at, r)) if now.duration_since(*at) < FRESH && r.addresses == addresses => match &r.error {
                    None => {}
                    Some(e) => why.push(format!("{link}: {e}")),
                },
                _ => why.push(format!(
                    "{} has not yet said whether it reaches {}",
                    name(&self.hosts, place),
                    name(&self.hosts, next)
                )),
            }
        }
        (!why.is_empty()).then(|| format!("checking MLX's links before forming: {}", why.join("; ")))
    }

    /// Rank 0 probes rank 1's MLX addresses (held by rank 1 while it waits), as each worker
    /// probes its right neighbour's: again every 2 s, or at once when rank 1 is another
    /// machine or was not reached. Blocks for the probe.
    pub fn probe_own_link(&self) {
        let (addresses, due) = {
            let state = self.state();
            let Some((_, addresses)) = state.right_of(&self.hosts, 0) else { return };
            let due = probe_due(state.reached[0].as_ref().map(|(at, r)| (r, *at)), &addresses);
            (addresses, due)
        };
        if due {
            let error = super::mlx_address::reach(&addresses, PROBE_WITHIN).err();
            self.state().note_reached(0, Reached { addresses, error });
        }
    }

    /// The current list.
    pub fn membership(&self) -> Membership {
        self.state().membership.clone()
    }

    /// Asks the members checking in to probe their right neighbours (or no longer): only while
    /// rank 0 decides whom to form with, when every address is held.
    pub fn set_probing(&self, probing: bool) {
        self.state().probing = probing;
    }

    /// Tells the members checking in to form now (or no longer).
    pub fn set_forming(&self, form: bool) {
        self.state().form = form;
    }

    /// The machines of the host file heard from lately that are not members (back after being
    /// left out, or a first start that missed the forming).
    pub fn returned(&self) -> Vec<usize> {
        self.state().back(Instant::now())
    }

    /// Those checked in again but held off since their take-in failed, with how long they
    /// still are: a person may ask to try them sooner (the cause mended).
    pub fn held_back(&self) -> Vec<(usize, Duration)> {
        self.state().held(Instant::now())
    }

    /// Who forms next: every member heard from lately forms (a machine left out is taken back
    /// only by a start of its own, [`Self::returned`]); a member not heard from for over `drop_after` is left out if
    /// `fits` the others' rooms (rank 0's first, `own_room`), else waited for; so is one behind
    /// a link that cannot be made, where `cut_counts` (not in a take-in, which falls back).
    pub fn decide(
        &self,
        (drop_after, cut_counts): (Option<Duration>, bool),
        own_room: u64,
        fits: &mut dyn FnMut(&[u64]) -> Result<(), String>,
    ) -> Decision {
        let mut state = self.state();
        decide(&mut state, &self.hosts, Instant::now(), (drop_after, cut_counts), own_room, fits)
    }
}

/// What is said of the link from the machine at `from` to the one at `to` that cannot be made.
fn link_name(hosts: &HostFile, from: usize, to: usize) -> String {
    format!("{} cannot reach {}", name(hosts, from), name(hosts, to))
}

/// Whether a probe of a neighbour's `addresses` is due, given the last one (what it found, and
/// when): every 2 s, and at once when the neighbour changed or was not reached (it may have
/// just started).
fn probe_due(last: Option<(&Reached, Instant)>, addresses: &[String]) -> bool {
    last.is_none_or(|(r, at)| r.addresses != addresses || r.error.is_some() || at.elapsed() > Duration::from_secs(2))
}

fn fresh(state: &State, place: usize, now: Instant) -> bool {
    state.seen[place].is_some_and(|s| now.duration_since(s.at) < FRESH) && state.problems[place].is_none()
}

/// What is said of a member the cluster waits for: its problem if it told one lately, else how
/// long it has been silent.
fn missing_reason(state: &State, hosts: &HostFile, place: usize, now: Instant, gone_for: Duration) -> String {
    match &state.problems[place] {
        Some((at, problem)) if now.duration_since(*at) < FRESH => format!("{}: {problem}", name(hosts, place)),
        _ => format!("{}, not heard from for {} s", name(hosts, place), gone_for.as_secs()),
    }
}

fn decide(
    state: &mut State,
    hosts: &HostFile,
    now: Instant,
    (drop_after, cut_counts): (Option<Duration>, bool),
    own_room: u64,
    fits: &mut dyn FnMut(&[u64]) -> Result<(), String>,
) -> Decision {
    let missing: Vec<usize> =
        state.membership.members.iter().copied().skip(1).filter(|&p| !fresh(state, p, now)).collect();
    // A machine there whose link cannot be made counts as gone from the first failed probe
    // (since it arrived), for `drop_after` alone: until then the cluster waits, naming the link
    // ([`Roster::unreached`]).
    let cut = match drop_after {
        Some(_) if cut_counts => state.cut_off(hosts, now, &missing),
        _ => None,
    };
    if missing.is_empty() && cut.as_ref().is_none_or(|&(_, since, _)| Some(now.duration_since(since)) < drop_after) {
        return Decision::Form(state.membership.clone());
    }
    let gone_for = |p: usize| match &cut {
        Some((c, since, _)) if *c == p => now.duration_since(*since),
        _ => now.duration_since(state.seen[p].map_or(state.opened, |s| s.at)),
    };
    let said = |p: usize| match &cut {
        Some((c, _, said)) if *c == p => said.clone(),
        _ => missing_reason(state, hosts, p, now, gone_for(p)),
    };
    let mut waited: Vec<usize> = missing.clone();
    waited.extend(cut.as_ref().map(|c| c.0));
    let names = waited.iter().map(|&p| said(p)).collect::<Vec<_>>().join("; ");
    let Some(drop_after) = drop_after else { return Decision::Wait(format!("waiting for {names}")) };
    let lost: Vec<usize> = waited.iter().copied().filter(|&p| gone_for(p) >= drop_after).collect();
    if lost.is_empty() {
        return Decision::Wait(format!(
            "waiting for {names}; the cluster forms without a machine gone for {} s if the model fits on the others",
            drop_after.as_secs()
        ));
    }
    let kept: Vec<usize> = state.membership.members.iter().copied().filter(|p| !lost.contains(p)).collect();
    let rooms: Vec<u64> =
        kept.iter().map(|&p| if p == 0 { own_room } else { state.seen[p].map_or(0, |s| s.room) }).collect();
    match fits(&rooms) {
        Ok(()) => {
            state.membership = Membership { generation: state.membership.generation + 1, members: kept };
            decide(state, hosts, now, (Some(drop_after), cut_counts), own_room, fits)
        }
        Err(why) => Decision::Wait(format!("waiting for {names}; not serving without it: {why}")),
    }
}

/// Where rank 0's roster listens: each of its hosts, at `port`.
fn roster_addresses(hosts: &HostFile, port: u16) -> Vec<String> {
    let mut addresses: Vec<String> =
        hosts.ranks[0].iter().filter_map(|a| a.rsplit_once(':').map(|(host, _)| format!("{host}:{port}"))).collect();
    let mut seen = std::collections::HashSet::new();
    addresses.retain(|a| seen.insert(a.clone()));
    addresses
}

/// The roster's port unless one is chosen: rank 0's port in the host file plus one, or the next
/// one no rank of the file uses (every rank works it out the same).
pub fn default_port(hosts: &HostFile) -> u16 {
    let used: Vec<u16> = hosts.ranks.iter().flatten().filter_map(|a| a.rsplit_once(':')?.1.parse().ok()).collect();
    let first = used.first().copied().unwrap_or(super::hostfile::DEFAULT_PORT);
    (1..=u16::MAX).map(|step| first.wrapping_add(step)).find(|p| *p > 1023 && !used.contains(p)).unwrap_or(first)
}

/// A worker's side: checks in with rank 0 (at `place` in the host file, with `room` for
/// weights and its `identity`) until rank 0 tells the members to form and this machine is one;
/// returns the list. Waits as long as it takes (rank 0 may be starting); an error only when
/// rank 0 refuses it.
pub fn await_turn(
    hosts: &HostFile,
    port: u16,
    place: usize,
    room: u64,
    identity: NodeIdentity,
) -> Result<Membership, String> {
    let mut addresses = roster_addresses(hosts, port);
    let mut check_in = CheckIn { place, room, identity, problem: None, present: false, reached: None, post: None };
    // This machine's MLX addresses, held until it forms (its left neighbour probes them).
    let mut held: Option<super::mlx_address::Held> = None;
    let mut probed: Option<Instant> = None;
    let started = Instant::now();
    let mut told: Option<Instant> = None;
    let mut last_error = String::new();
    let quiet_for = |told: Option<Instant>| told.is_none_or(|t| t.elapsed() > Duration::from_secs(30));
    loop {
        // Told with each check-in, and said here when it changes: rank 0 waits for it to clear.
        let problem = match held {
            Some(_) => None,
            None => super::mlx_address::hold(&hosts.ranks[place]).map(|h| held = Some(h)).err(),
        };
        if problem != check_in.problem {
            match &problem {
                Some(why) => eprintln!("rank {place}: {why}; the cluster waits for this machine until it can"),
                None => eprintln!("rank {place}: MLX can listen at this machine's address again"),
            }
        }
        check_in.problem = problem;
        match ask(&mut addresses, &check_in) {
            Ok(Answer { refused: Some(why), .. }) => return Err(format!("rank 0 refused rank {place}: {why}")),
            Ok(Answer { membership, form: true, .. })
                if membership.rank_of(place).is_some() && check_in.problem.is_none() =>
            {
                // Its addresses let go and present: it starts MLX once rank 0 says all are.
                held = None;
                match be_present(&addresses, hosts.ranks[place].first(), check_in.clone()) {
                    Ok(()) => return Ok(membership),
                    Err(why) => {
                        presence::step_back(&format!("rank {place}: {why}"));
                        eprintln!("rank {place}: {why}; checking in again");
                        std::thread::sleep(POLL);
                    }
                }
            }
            Ok(Answer { membership, probe, .. }) => {
                // Told with the next check-in.
                if let Some(probe) = probe {
                    if probe_due(check_in.reached.as_ref().zip(probed), &probe) {
                        let error = super::mlx_address::reach(&probe, PROBE_WITHIN).err();
                        let before = check_in.reached.as_ref().and_then(|r| r.error.clone());
                        if let Some(why) = error.as_ref().filter(|&e| before.as_ref() != Some(e)) {
                            eprintln!(
                                "rank {place}: MLX's link to the next machine: {why}; the cluster waits until it can"
                            );
                        }
                        check_in.reached = Some(Reached { addresses: probe, error });
                        probed = Some(Instant::now());
                    }
                }
                // Said only once it has lasted: rank 0 takes a machine back when it is idle.
                let left_out = membership.rank_of(place).is_none() && started.elapsed() > Duration::from_secs(30);
                if left_out && quiet_for(told) {
                    eprintln!(
                        "rank {place}: the cluster serves without this machine; it joins when rank 0 forms again"
                    );
                    told = Some(Instant::now());
                }
                std::thread::sleep(POLL);
            }
            Err(e) => {
                if e != last_error || quiet_for(told) {
                    eprintln!("rank {place}: waiting for rank 0's roster at {}: {e}", addresses.join(", "));
                    (told, last_error) = (Some(Instant::now()), e);
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// A member told to form: present at rank 0 from now on ([`presence`]), on a check-in of its
/// own at the address that just answered, until rank 0 says every member is (then MLX starts).
/// Its link post opens beside its first MLX address (`mlx_address`) first, for the check-in to
/// name; it then watches the post rank 0 names.
fn be_present(addresses: &[String], mlx_address: Option<&String>, mut check_in: CheckIn) -> Result<(), String> {
    check_in.present = true;
    let post = mlx_address.map(|a| Post::open(a)).transpose().unwrap_or_else(|why| {
        eprintln!("rank {}: the link to this machine goes unwatched: {why}", check_in.place);
        None
    });
    check_in.post = post.as_ref().map(Post::port);
    let address = addresses.first().ok_or("no address of rank 0's roster")?;
    let (stream, answer) = exchange_on(address, &check_in).map_err(|e| format!("cannot be present at rank 0: {e}"))?;
    if let Some(why) = answer.refused {
        return Err(format!("rank 0 refused it: {why}"));
    }
    let told = presence::keep(stream).ok_or("cannot be present at rank 0")?;
    let line = read_line_within(&told, 1024, FORM_WAIT)
        .map_err(|e| format!("rank 0 did not tell it to form within {} s: {e}", FORM_WAIT.as_secs()))?;
    match line.trim_end().split_once(' ') {
        Some((FORM_NOW, target)) => {
            presence::watch_rank_0(told);
            presence::watch_links(post, (!target.is_empty()).then(|| target.to_string()));
            Ok(())
        }
        _ => Err("rank 0 did not tell it to form (it started again?)".into()),
    }
}

/// One check-in, at the first of `addresses` that answers (moved to the front, so the next
/// check-in spends no time on one this machine cannot reach).
fn ask(addresses: &mut [String], check_in: &CheckIn) -> Result<Answer, String> {
    let mut last = String::from("no address");
    for i in 0..addresses.len() {
        match exchange(&addresses[i], check_in) {
            Ok(answer) => {
                addresses[..=i].rotate_right(1);
                return Ok(answer);
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

/// A line of at most `limit` bytes, read within `within` however slowly the peer sends it.
fn read_line_within(stream: &TcpStream, limit: u64, within: Duration) -> std::io::Result<String> {
    let deadline = Instant::now() + within;
    let mut reader = BufReader::new(stream).take(limit);
    let mut bytes = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the check-in took too long"));
        }
        stream.set_read_timeout(Some(left))?;
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            break;
        }
        let (taken, done) = match buffer.iter().position(|&b| b == b'\n') {
            Some(at) => (at + 1, true),
            None => (buffer.len(), false),
        };
        bytes.extend_from_slice(&buffer[..taken]);
        reader.consume(taken);
        if done {
            break;
        }
    }
    String::from_utf8(bytes).map_err(std::io::Error::other)
}

fn exchange(address: &str, check_in: &CheckIn) -> std::io::Result<Answer> {
    exchange_on(address, check_in).map(|(_, answer)| answer)
}

/// A check-in at `address`: its connection, still open, and the answer.
fn exchange_on(address: &str, check_in: &CheckIn) -> std::io::Result<(TcpStream, Answer)> {
    let target = address
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("{address} resolves to nothing")))?;
    let stream = TcpStream::connect_timeout(&target, EXCHANGE)?;
    stream.set_read_timeout(Some(EXCHANGE))?;
    stream.set_write_timeout(Some(EXCHANGE))?;
    let mut text = serde_json::to_string(check_in).map_err(std::io::Error::other)?;
    text.push('\n');
    (&stream).write_all(text.as_bytes())?;
    let line = read_line_within(&stream, 1 << 16, EXCHANGE)?;
    let answer = serde_json::from_str(&line).map_err(std::io::Error::other)?;
    Ok((stream, answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(n: usize) -> HostFile {
        HostFile { ranks: (0..n).map(|r| vec![format!("127.0.0.1:{}", 5000 + r)]).collect() }
    }

    fn state(n: usize, opened: Instant) -> State {
        State {
            membership: Membership::everyone(&hosts(n)),
            form: false,
            probing: false,
            seen: vec![None; n],
            problems: vec![None; n],
            opened,
            holds: Holds::default(),
            departures: vec![None; n],
            reached: vec![None; n],
            unreached_since: vec![None; n],
            arrived: vec![None; n],
            present: (0..n).map(|_| None).collect(),
            posts: vec![None; n],
            links_down: vec![None; n],
        }
    }

    #[test]
    fn a_machine_behind_a_link_that_cannot_be_made_is_left_out_past_the_limit() {
        let (file, t0) = (hosts(3), Instant::now());
        let mut state = state(3, t0);
        let now = t0 + Duration::from_secs(100);
        for place in 1..3 {
            state.seen[place] = Some(Seen { at: now, room: 1 });
            state.arrived[place] = Some(t0);
        }
        let reached = |to: usize, error: Option<&str>| Reached {
            addresses: vec![format!("127.0.0.1:{}", 5000 + to)],
            error: error.map(str::to_string),
        };
        let mut fits = |_: &[u64]| Ok(());
        // Rank 1 has not reached rank 2 since 10 s before `now` (its probes then agree).
        state.note_reached(1, reached(2, Some("no answer")));
        state.unreached_since[1] = Some(now - Duration::from_secs(10));
        state.reached[1].as_mut().unwrap().0 = now;
        // Without a limit, or within it: all of them (rank 0 then waits on the link, naming it:
        // `unreached`).
        let everyone = Decision::Form(Membership::everyone(&file));
        assert_eq!(decide(&mut state, &file, now, (None, true), 1, &mut fits), everyone);
        assert_eq!(decide(&mut state, &file, now, (Some(Duration::from_secs(20)), true), 1, &mut fits), everyone);
        // Not in a take-in; nor for a machine that arrived within the limit (the probes failed
        // while it was away).
        assert_eq!(decide(&mut state, &file, now, (Some(Duration::from_secs(5)), false), 1, &mut fits), everyone);
        state.arrived[2] = Some(now - Duration::from_secs(1));
        assert_eq!(decide(&mut state, &file, now, (Some(Duration::from_secs(5)), true), 1, &mut fits), everyone);
        state.arrived[2] = Some(t0);
        // Past it: left out (the machine not reached), where the model fits on the others.
        let mut full = |_: &[u64]| Err("no room".to_string());
        let Decision::Wait(why) = decide(&mut state, &file, now, (Some(Duration::from_secs(5)), true), 1, &mut full)
        else {
            panic!("left out where the model does not fit")
        };
        assert_eq!(
            why,
            "waiting for rank 2 (127.0.0.1:5002): rank 1 (127.0.0.1:5001) cannot reach rank 2 (127.0.0.1:5002): \
             no answer; not serving without it: no room"
        );
        assert_eq!(
            decide(&mut state, &file, now, (Some(Duration::from_secs(5)), true), 1, &mut fits),
            Decision::Form(Membership { generation: 1, members: vec![0, 1] })
        );
        // Rank 1 that cannot reach rank 0 (the ring's last now): rank 1 is left out, never rank 0.
        state.note_reached(1, reached(0, Some("refused")));
        state.unreached_since[1] = Some(now - Duration::from_secs(10));
        state.reached[1].as_mut().unwrap().0 = now;
        let Decision::Form(alone) = decide(&mut state, &file, now, (Some(Duration::from_secs(5)), true), 1, &mut fits)
        else {
            panic!("rank 0 left out")
        };
        assert_eq!(alone.members, vec![0]);
        // Both of rank 1's links failing (its cable gone): rank 1 is left out, not rank 2.
        let mut state = super::tests::state(3, t0);
        for place in 1..3 {
            state.seen[place] = Some(Seen { at: now, room: 1 });
            state.arrived[place] = Some(t0);
        }
        for (place, to) in [(0, 1), (1, 2)] {
            state.note_reached(place, reached(to, Some("no route to host")));
            state.unreached_since[place] = Some(now - Duration::from_secs(10));
            state.reached[place].as_mut().unwrap().0 = now;
        }
        let Decision::Form(without) =
            decide(&mut state, &file, now, (Some(Duration::from_secs(5)), true), 1, &mut fits)
        else {
            panic!("not left out")
        };
        assert_eq!(without.members, vec![0, 2]);
        // A link to a machine that is missing anyway blames no one: rank 2, silent, is left out
        // on its own account, and rank 1, which cannot reach it, stays.
        let mut state = super::tests::state(3, t0);
        state.seen[1] = Some(Seen { at: now, room: 1 });
        state.arrived[1] = Some(t0);
        state.note_reached(1, reached(2, Some("refused")));
        state.unreached_since[1] = Some(t0);
        state.reached[1].as_mut().unwrap().0 = now;
        let Decision::Form(kept) = decide(&mut state, &file, now, (Some(Duration::from_secs(5)), true), 1, &mut fits)
        else {
            panic!("rank 2 not left out")
        };
        assert_eq!(kept.members, vec![0, 1]);
        // A probe that got through clears the clock.
        let mut state = super::tests::state(3, t0);
        state.note_reached(2, reached(0, Some("refused")));
        assert!(state.unreached_since[2].is_some());
        state.note_reached(2, reached(0, None));
        assert_eq!(state.unreached_since[2], None);
    }

    #[test]
    fn a_member_gone_past_the_limit_is_left_out_only_if_the_model_fits_on_the_others() {
        let (file, t0) = (hosts(3), Instant::now());
        let mut s = state(3, t0);
        let limit = Some(Duration::from_secs(60));
        let mut fits = |rooms: &[u64]| if rooms.iter().sum::<u64>() >= 30 { Ok(()) } else { Err("too big".into()) };
        // Rank 1 checks in, rank 2 never does: waited for, and named, until the limit.
        s.seen[1] = Some(Seen { at: t0 + Duration::from_secs(59), room: 10 });
        let at = t0 + Duration::from_secs(59);
        let Decision::Wait(why) = decide(&mut s, &file, at, (limit, true), 20, &mut fits) else { panic!() };
        assert!(why.contains("rank 2 (127.0.0.1:5002), not heard from for 59 s"), "{why}");
        assert!(!why.contains("rank 1"), "{why}");
        // Past it, the others hold the model (20 + 10): rank 2 is left out, ranks renumber.
        let at = t0 + Duration::from_secs(61);
        let formed = decide(&mut s, &file, at, (limit, true), 20, &mut fits);
        assert_eq!(formed, Decision::Form(Membership { generation: 1, members: vec![0, 1] }));
        let m = s.membership.clone();
        assert_eq!((m.rank_of(1), m.rank_of(2)), (Some(1), None));
        assert_eq!(m.hosts(&file).ranks, [vec!["127.0.0.1:5000".to_string()], vec!["127.0.0.1:5001".to_string()]]);
        assert_eq!(m.left_out(&file), [2]);
        // Rank 2 back: the forming goes on without it; it is listed as back, to be taken in.
        s.seen[2] = Some(Seen { at: t0 + Duration::from_secs(62), room: 10 });
        s.seen[1] = Some(Seen { at: t0 + Duration::from_secs(62), room: 10 });
        let at = t0 + Duration::from_secs(63);
        let formed = decide(&mut s, &file, at, (limit, true), 20, &mut fits);
        assert_eq!(formed, Decision::Form(Membership { generation: 1, members: vec![0, 1] }));
        assert_eq!(s.back(at), [2]);
        // Back, but MLX cannot listen at its address: not taken in until it can.
        s.problems[2] = Some((at, "MLX cannot listen".into()));
        assert_eq!(s.back(at), Vec::<usize>::new());
        s.problems[2] = None;
        // Held off (its last take-in failed): not listed until its time passes.
        s.holds = Holds::default().failed(&[2], SystemTime::now());
        assert_eq!(s.back(at), Vec::<usize>::new());
        // Listed as held, for as long as it still is.
        let held = s.held(at);
        assert!(held.len() == 1 && held[0].0 == 2 && held[0].1 <= HOLD_OFF, "{held:?}");
        assert!(held[0].1 > HOLD_OFF - Duration::from_secs(60), "{held:?}");
        s.holds = Holds::default().failed(&[2], SystemTime::now() - HOLD_OFF * 2);
        assert_eq!(s.back(at), [2]);
        assert_eq!(s.held(at), []);
        // Where the others cannot hold it, the lost one is waited for, saying why.
        let mut s = state(3, t0);
        s.seen[1] = Some(Seen { at: t0 + Duration::from_secs(100), room: 5 });
        let at = t0 + Duration::from_secs(101);
        let Decision::Wait(why) = decide(&mut s, &file, at, (limit, true), 20, &mut fits) else { panic!() };
        assert!(why.contains("not serving without it: too big"), "{why}");
        assert_eq!(s.membership.generation, 0);
        // With no limit, it is waited for always.
        let Decision::Wait(why) = decide(&mut s, &file, at, (None, true), 1000, &mut fits) else { panic!() };
        assert!(why.starts_with("waiting for rank 2"), "{why}");
    }

    #[test]
    fn the_list_passes_to_a_restarted_rank_0_and_a_bad_one_is_ignored() {
        let file = hosts(4);
        let m = Membership { generation: 7, members: vec![0, 1, 3] };
        assert_eq!(Membership::parse(&m.to_env(), &file), Some(m.clone()));
        for bad in ["", "7", "7:1,3", "7:0,3,1", "7:0,4", "x:0,1"] {
            assert_eq!(Membership::parse(bad, &file), None, "{bad}");
        }
        assert_eq!(m.with(&[2]), Membership { generation: 8, members: vec![0, 1, 2, 3] });
        // Holds: each machine its own time, doubled for each failure, the others' kept.
        let t = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let once = Holds::default().failed(&[2], t);
        let twice = once.failed(&[2], t).failed(&[3], t);
        assert_eq!(twice.0, [(2, t + HOLD_OFF * 2, 2), (3, t + HOLD_OFF, 1)]);
        assert!(twice.active(2, t + HOLD_OFF) && !twice.active(3, t + HOLD_OFF) && !twice.active(1, t));
        assert_eq!(Holds::parse(&twice.to_env()), Some(twice.clone()));
        // A machine that served has its hold gone, and fails from the start again.
        let served = twice.without(&[0, 2]);
        assert_eq!(served.0, [(3, t + HOLD_OFF, 1)]);
        assert_eq!(served.failed(&[2], t).0[1], (2, t + HOLD_OFF, 1));
        assert_eq!(Holds::parse(""), Some(Holds::default()));
        assert_eq!(Holds::parse("2:x:1"), None);
        let many = (0..40).fold(Holds::default(), |h, _| h.failed(&[1], t));
        assert_eq!(many.0, [(1, t + MAX_HOLD, 40)]);
    }

    #[test]
    fn the_port_is_one_past_rank_0s_unless_the_file_uses_it() {
        assert_eq!(default_port(&hosts(3)), 5003);
        let launch = HostFile { ranks: vec![vec!["10.0.0.1:32323".into()], vec!["10.0.0.2:32323".into()]] };
        assert_eq!(default_port(&launch), 32324);
        assert_eq!(roster_addresses(&launch, 32324), ["10.0.0.1:32324"]);
    }

    fn identity(model: &str) -> NodeIdentity {
        NodeIdentity { version: env!("CARGO_PKG_VERSION").into(), model: model.into(), settings: "s".into() }
    }

    /// A check-in of the machine at `place` serving model `m (abc)`, ready to join, with room 1.
    fn ready(place: usize) -> CheckIn {
        CheckIn {
            place,
            room: 1,
            identity: identity("m (abc)"),
            problem: None,
            present: false,
            reached: None,
            post: None,
        }
    }

    #[test]
    fn workers_check_in_and_form_when_told() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let file =
            HostFile { ranks: vec![vec![format!("127.0.0.1:{}", port.wrapping_sub(1))], vec![free.to_string()]] };
        let roster = Roster::open(&file, port, Membership::everyone(&file), identity("m (abc)")).unwrap();
        let worker = std::thread::spawn(move || await_turn(&file, port, 1, 123, identity("m (abc)")));
        let started = Instant::now();
        while roster.decide((None, true), 1, &mut |_| Ok(()))
            != Decision::Form(Membership { generation: 0, members: vec![0, 1] })
        {
            assert!(started.elapsed() < Duration::from_secs(10), "rank 1 never checked in");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!worker.is_finished(), "a worker forms only when told");
        roster.set_forming(true);
        // Present (its address let go), it forms once rank 0 says all are.
        let everyone = Membership { generation: 0, members: vec![0, 1] };
        while !roster.absent(&everyone).is_empty() {
            assert_eq!(roster.absent(&everyone), [(1, false)], "checked in lately");
            assert!(started.elapsed() < Duration::from_secs(10), "rank 1 never came to form");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!worker.is_finished(), "a worker forms only when all are present");
        // Each has a link post the other watches from now on: both reached, nothing lost.
        let post = roster.state().posts[1].expect("rank 1 named its link post");
        roster.tell_form(&everyone).unwrap();
        assert_eq!(worker.join().unwrap(), Ok(everyone));
        assert!(TcpStream::connect(("127.0.0.1", post)).is_ok());
        let own = roster.own_links.lock().unwrap().0.as_ref().map(Post::port).expect("rank 0's post");
        assert!(TcpStream::connect(("127.0.0.1", own)).is_ok());
        assert!(roster.own_links.lock().unwrap().1.is_some(), "rank 0 watches rank 1's post");
        assert_eq!(roster.state().seen[1].map(|s| s.room), Some(123));
        // Longer than three failed probes take: no link is said to be down.
        std::thread::sleep(Duration::from_millis(3500));
        assert_eq!(roster.lost(), None);
        // Another model, or a rank the host file does not have: refused with the reason, and
        // not counted as checked in.
        let address = format!("127.0.0.1:{port}");
        let other = CheckIn { identity: identity("m (def)"), ..ready(1) };
        let refused = exchange(&address, &other).unwrap().refused.unwrap();
        assert!(refused.contains("model m (def) on rank 1, m (abc) on rank 0"), "{refused}");
        let stranger = ready(5);
        let refused = exchange(&address, &stranger).unwrap().refused.unwrap();
        assert!(refused.contains("rank 5 is not a worker"), "{refused}");
        assert_eq!(roster.state().seen[1].map(|s| s.room), Some(123));
        // A line that is not a check-in gets no answer, and a peer that sends nothing is let go
        // at the deadline; the roster answers others meanwhile.
        let mut junk = TcpStream::connect(&address).unwrap();
        junk.write_all(b"hello\n").unwrap();
        let silent = TcpStream::connect(&address).unwrap();
        let asked = Instant::now();
        assert!(exchange(&address, &CheckIn { room: 7, ..ready(1) }).is_ok());
        assert!(asked.elapsed() < EXCHANGE, "a silent peer held the roster up");
        assert_eq!(roster.state().seen[1].map(|s| s.room), Some(7));
        // There, but MLX cannot listen at its address: named, and the cluster waits for it.
        let held = CheckIn { room: 7, problem: Some("MLX cannot listen".into()), ..ready(1) };
        assert!(exchange(&address, &held).unwrap().refused.is_none());
        let Decision::Wait(why) = roster.decide((None, true), 1, &mut |_| Ok(())) else {
            panic!("formed with a problem")
        };
        assert_eq!(why, format!("waiting for rank 1 ({free}): MLX cannot listen"));
        assert!(exchange(&address, &CheckIn { problem: None, ..held }).is_ok());
        assert!(matches!(roster.decide((None, true), 1, &mut |_| Ok(())), Decision::Form(_)));
        let mut reply = String::new();
        let _ = BufReader::new(&junk).read_line(&mut reply);
        assert!(reply.is_empty(), "{reply}");
        silent.set_read_timeout(Some(EXCHANGE * 3)).unwrap();
        assert_eq!(BufReader::new(&silent).read_line(&mut reply).unwrap_or(0), 0, "closed unanswered");
    }

    #[test]
    fn a_member_gone_without_a_goodbye_is_named_and_one_that_left_is_not() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let file = HostFile { ranks: vec![vec![format!("127.0.0.1:{}", port + 1)], vec!["127.0.0.1:6001".into()]] };
        let roster = Roster::open(&file, port, Membership::everyone(&file), identity("m (abc)")).unwrap();
        let (told_tx, told) = std::sync::mpsc::channel();
        roster.on_lost(move |why| told_tx.send(why).unwrap());
        let address = format!("127.0.0.1:{port}");
        let present = CheckIn { present: true, ..ready(1) };
        let departed = |expect: &str| {
            let started = Instant::now();
            while !roster.state().departures[1].as_ref().is_some_and(|(_, d)| format!("{d:?}").starts_with(expect)) {
                assert!(started.elapsed() < Duration::from_secs(5), "not departed: {expect}");
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        // A member that starts again says why: not taken for the machine lost.
        let (stream, answer) = exchange_on(&address, &present).unwrap();
        assert!(answer.refused.is_none());
        (&stream).write_all(b"\n\nleaving rank 1: the cluster lost a rank\n").unwrap();
        departed("Left");
        assert_eq!(roster.lost(), None);
        assert!(told.try_recv().is_err());
        // One whose connection closes without a word is named, and rank 0 told at once.
        let (stream, _) = exchange_on(&address, &present).unwrap();
        drop(stream);
        departed("Closed");
        let named = "rank 1 (127.0.0.1:6001) is gone: its connection to rank 0 closed without a goodbye";
        assert!(roster.lost().is_some_and(|l| l.starts_with(named)), "{:?}", roster.lost());
        assert!(told.recv_timeout(Duration::from_secs(1)).unwrap().starts_with(named));
    }

    #[test]
    fn a_link_a_member_says_is_down_is_named_once_until_it_is_back() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let ranks = [port + 1, 6001, 6002].map(|p| vec![format!("127.0.0.1:{p}")]);
        let file = HostFile { ranks: ranks.to_vec() };
        let roster = Roster::open(&file, port, Membership::everyone(&file), identity("m (abc)")).unwrap();
        let (told_tx, told) = std::sync::mpsc::channel();
        roster.on_lost(move |why| told_tx.send(why).unwrap());
        let present = CheckIn { present: true, post: Some(7), ..ready(1) };
        let (stream, _) = exchange_on(&format!("127.0.0.1:{port}"), &present).unwrap();
        let said = |line: &str| (&stream).write_all(line.as_bytes()).unwrap();
        said("\n");
        let started = Instant::now();
        while roster.state().posts[1] != Some(7) {
            assert!(started.elapsed() < Duration::from_secs(5), "not present");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Down: rank 0 told at once, naming both ends; said again, not told twice.
        said("down cannot reach 127.0.0.1:9: refused\ndown cannot reach 127.0.0.1:9: refused\n");
        let named = "rank 1 (127.0.0.1:6001) cannot reach rank 2 (127.0.0.1:6002) (the link between them is down: cannot reach 127.0.0.1:9: refused)";
        assert_eq!(told.recv_timeout(Duration::from_secs(2)).unwrap(), named);
        assert!(told.recv_timeout(Duration::from_millis(300)).is_err(), "told once");
        assert_eq!(roster.lost().as_deref(), Some(named), "the witness names the link");
        // Back, then down again: told again.
        said("\n");
        let started = Instant::now();
        while roster.lost().is_some() {
            assert!(started.elapsed() < Duration::from_secs(5), "not back");
            std::thread::sleep(Duration::from_millis(20));
        }
        said("down no answer\n");
        assert!(told.recv_timeout(Duration::from_secs(2)).unwrap().ends_with("is down: no answer)"));
    }

    #[test]
    fn forming_waits_until_each_worker_reached_its_right_neighbour_naming_a_link_it_cannot_make() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let file = hosts(3);
        let roster = Roster::open(&file, port, Membership::everyone(&file), identity("m (abc)")).unwrap();
        let everyone = Membership::everyone(&file);
        let address = format!("127.0.0.1:{port}");
        let check_in =
            |place: usize, reached: Option<Reached>| exchange(&address, &CheckIn { reached, ..ready(place) }).unwrap();
        // Asked only while rank 0 decides (holding its addresses): each member its right
        // neighbour's, rank 1 rank 2's, rank 2 rank 0's.
        assert_eq!(check_in(1, None).probe, None);
        roster.set_probing(true);
        assert_eq!(check_in(1, None).probe, Some(vec!["127.0.0.1:5002".to_string()]));
        assert_eq!(check_in(2, None).probe, Some(vec!["127.0.0.1:5000".to_string()]));
        let why = roster.unreached(&everyone).expect("no probe told yet");
        assert!(why.contains("rank 1 (127.0.0.1:5001) has not yet said whether it reaches rank 2"), "{why}");
        assert!(why.contains("rank 0 (127.0.0.1:5000) has not yet said whether it reaches rank 1"), "{why}");
        // Rank 2 reaches rank 0, rank 0 rank 1; rank 1 cannot reach rank 2 (a firewall there):
        // that link named.
        let ok = |to: &str| Some(Reached { addresses: vec![to.to_string()], error: None });
        roster.state().note_reached(0, ok("127.0.0.1:5001").unwrap());
        check_in(2, ok("127.0.0.1:5000"));
        let failed = Reached {
            addresses: vec!["127.0.0.1:5002".into()],
            error: Some("cannot reach 127.0.0.1:5002: no answer in 1.5 s (a firewall there, or no route?)".into()),
        };
        check_in(1, Some(failed));
        let why = roster.unreached(&everyone).expect("a link that cannot be made");
        assert_eq!(
            why,
            "checking MLX's links before forming: rank 1 (127.0.0.1:5001) cannot reach rank 2 (127.0.0.1:5002): \
             cannot reach 127.0.0.1:5002: no answer in 1.5 s (a firewall there, or no route?)"
        );
        // A probe of addresses that are no longer its neighbour's does not count.
        check_in(1, ok("127.0.0.1:5000"));
        assert!(roster.unreached(&everyone).unwrap().contains("rank 1 (127.0.0.1:5001) has not yet said"));
        check_in(1, ok("127.0.0.1:5002"));
        assert_eq!(roster.unreached(&everyone), None);
        // Rank 0's own probe of rank 1 (not there: refused) is told as the workers' are.
        roster.state().reached[0] = None;
        roster.probe_own_link();
        let why = roster.unreached(&everyone).expect("rank 1's address is not held");
        assert!(why.starts_with("checking MLX's links before forming: rank 0 (127.0.0.1:5000) cannot reach rank 1 (127.0.0.1:5001): cannot reach 127.0.0.1:5001: "), "{why}");
        // Rank 0 holds its own addresses while it waits (rank 2 probes them), until let go.
        let own =
            format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
        let file = HostFile { ranks: vec![vec![own.clone()], vec!["127.0.0.1:5001".into()]] };
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let roster = Roster::open(&file, port, Membership::everyone(&file), identity("m (abc)")).unwrap();
        assert_eq!(roster.own_problem(), None);
        assert_eq!(super::super::mlx_address::reach(std::slice::from_ref(&own), PROBE_WITHIN), Ok(()));
        roster.release_own();
        assert!(super::super::mlx_address::reach(&[own], PROBE_WITHIN).is_err());
    }
}
