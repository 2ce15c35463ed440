//! The consistent-hash ring: which node owns an identification-key hash.
//!
//! Every member (a node name such as `10.0.0.7:7100`) puts [`virtual_nodes`](Ring::virtual_nodes)
//! points on a ring of `u64`s; a key hash belongs to the member of the first point at or after
//! it, wrapping past `u64::MAX` to the first point. A point is the XXH3-64 hash of an
//! unambiguous encoding of (member name, point number): the name's length as a `u32`
//! little-endian, its bytes, then the point number as a `u32` little-endian. Points are sorted,
//! equal points ordered by member name, and members are sorted and deduplicated first, so every
//! node that knows the same membership, in whatever order it learnt it, builds the same ring.
//! The encoding may never change: nodes of different builds must agree.
//!
//! Adding a member only takes hash ranges from the others (each key either stays or moves to
//! the new member), and removing one only gives its ranges away, so a membership change moves
//! about `1/N` of the keys and no key moves between members that stay.
//!
//! Lookup is a table lookup and a short scan: a direct index of about one slot per point maps
//! the top bits of the hash to the first point of its slot, and the scan goes on from there
//! over the few points inside the slot (a sentinel point at `u64::MAX` ends every scan, so
//! there is no wrap-around branch). With about one point per slot the scan is mostly one or two
//! comparisons; a branch-free fixed-length search over the slot measured slower in routing.

use xxhash_rust::xxh3::xxh3_64;

/// Points per member unless the configuration says otherwise: with 256, the largest of three
/// members' shares of the hash space is on average 12 % above the smallest (see the tests).
pub const DEFAULT_VIRTUAL_NODES: u32 = 256;

/// The largest direct index, in bits (4 Mi slots); rings with more points scan a little longer.
const MAX_INDEX_BITS: u32 = 22;

/// A consistent-hash ring over a fixed membership; immutable once built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    /// Sorted and unique: the index of a name is the member id [`Ring::owner`] returns.
    members: Vec<String>,
    virtual_nodes: u32,
    /// The sorted points, followed by a sentinel `u64::MAX` (when the ring has members).
    points: Vec<u64>,
    /// The member owning each point; the sentinel's is the first point's (the wrap-around).
    owners: Vec<u16>,
    /// `slots[t]` is the position of the first point `>= t << shift`; one more entry than slots.
    slots: Vec<u32>,
    /// `64 - index bits`: the slot of a hash is `hash >> shift`.
    shift: u32,
    /// Names the ring (its members and points): two nodes with equal fingerprints route alike.
    fingerprint: u64,
}

impl Ring {
    /// A ring of `members` (in any order; duplicates are ignored) with `virtual_nodes` points
    /// each (0 is taken as 1).
    pub fn new<S: AsRef<str>>(members: &[S], virtual_nodes: u32) -> Ring {
        let virtual_nodes = virtual_nodes.max(1);
        let mut names: Vec<String> = members.iter().map(|m| m.as_ref().to_owned()).collect();
        names.sort_unstable();
        names.dedup();
        assert!(names.len() <= u16::MAX as usize + 1, "too many ring members");

        let total = names.len() * virtual_nodes as usize;
        assert!(total < u32::MAX as usize, "too many ring points");
        // (point, member): members are sorted by name, so sorting the pairs orders equal points
        // by member name, as every node must.
        let mut pairs: Vec<(u64, u16)> = Vec::with_capacity(total);
        let mut buf = Vec::new();
        for (id, name) in names.iter().enumerate() {
            for i in 0..virtual_nodes {
                pairs.push((point(name, i, &mut buf), id as u16));
            }
        }
        pairs.sort_unstable();

        let mut points: Vec<u64> = pairs.iter().map(|&(p, _)| p).collect();
        let mut owners: Vec<u16> = pairs.iter().map(|&(_, m)| m).collect();
        if let Some(&first) = owners.first() {
            // Past the last point the ring wraps to the first: the sentinel says so without a
            // branch. A real point at u64::MAX sorts before it and wins, as it should.
            points.push(u64::MAX);
            owners.push(first);
        }

        // About one slot per point, a power of two, at least two.
        let bits = (total.max(2).next_power_of_two().trailing_zeros()).clamp(1, MAX_INDEX_BITS);
        let slots = index(&points[..total], bits);
        let mut named = virtual_nodes.to_le_bytes().to_vec();
        for m in &names {
            named.extend_from_slice(&(m.len() as u32).to_le_bytes());
            named.extend_from_slice(m.as_bytes());
        }
        let fingerprint = xxhash_rust::xxh3::xxh3_64(&named);
        Ring { members: names, virtual_nodes, points, owners, slots, shift: 64 - bits, fingerprint }
    }

    /// A ring of one member, which owns every hash.
    pub fn with_one(name: &str) -> Ring {
        Ring::new(&[name], 1)
    }

    /// The members, sorted and unique: a member's index here is its id.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// The member (an index into [`Ring::members`]) owning `hash`.
    ///
    /// # Panics
    ///
    /// If the ring has no member.
    #[inline]
    pub fn owner(&self, hash: u64) -> usize {
        if self.members.is_empty() {
            empty_ring();
        }
        let slot = (hash >> self.shift) as usize;
        // The first point >= hash is at or after the slot's first point, and at or before the
        // next slot's first point (or the sentinel), so the scan always stops within bounds.
        let mut i = self.slots[slot] as usize;
        let points = &self.points[..];
        while points[i] < hash {
            i += 1;
        }
        self.owners[i] as usize
    }

    /// The id of the member called `name`.
    /// Equal on every node whose ring has the same members and virtual nodes.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.members.binary_search_by(|m| m.as_str().cmp(name)).ok()
    }

    /// Each member's share of the hash space, in [`Ring::members`] order; they sum to 1.
    pub fn shares(&self) -> Vec<f64> {
        let mut owned = vec![0u128; self.members.len()];
        let n = self.points.len().saturating_sub(1); // without the sentinel
        for j in 0..n {
            // Point j owns the hashes after the previous point, up to and including itself;
            // the first point also owns those after the last, across the wrap.
            let from = if j == 0 { self.points[n - 1] as u128 } else { self.points[j - 1] as u128 };
            let to = if j == 0 { self.points[0] as u128 + (1u128 << 64) } else { self.points[j] as u128 };
            owned[self.owners[j] as usize] += to - from;
        }
        owned.iter().map(|&o| o as f64 / 2f64.powi(64)).collect()
    }

    /// Points per member.
    pub fn virtual_nodes(&self) -> u32 {
        self.virtual_nodes
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

/// `index[t]`: the position of the first point `>= t << (64 - bits)`, for every slot `t`, then
/// the number of points.
fn index(points: &[u64], bits: u32) -> Vec<u32> {
    let shift = 64 - bits;
    let slot_count = 1usize << bits;
    let mut slots = Vec::with_capacity(slot_count + 1);
    let mut at = 0usize;
    for t in 0..slot_count as u64 {
        let start = t << shift;
        while at < points.len() && points[at] < start {
            at += 1;
        }
        slots.push(at as u32);
    }
    slots.push(points.len() as u32);
    slots
}

/// Point `i` of member `name` (see the module documentation; may never change).
fn point(name: &str, i: u32, buf: &mut Vec<u8>) -> u64 {
    buf.clear();
    buf.extend_from_slice(&(name.len() as u32).to_le_bytes());
    buf.extend_from_slice(name.as_bytes());
    buf.extend_from_slice(&i.to_le_bytes());
    xxh3_64(buf)
}

#[cold]
#[inline(never)]
fn empty_ring() -> ! {
    panic!("a ring without members owns nothing")
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_fingerprint_names_the_membership_not_its_order() {
        let a = Ring::new(&["b:1", "a:1", "a:1"], 64).fingerprint();
        assert_eq!(a, Ring::new(&["a:1", "b:1"], 64).fingerprint());
        assert_ne!(a, Ring::new(&["a:1", "b:1"], 128).fingerprint());
        assert_ne!(a, Ring::new(&["a:1", "b:1", "c:1"], 64).fingerprint());
        assert_ne!(Ring::new(&["ab:1"], 64).fingerprint(), Ring::new(&["a", "b:1"], 64).fingerprint());
    }

    use super::*;

    /// The owner by the definition: the member of the first point >= hash, else the first.
    fn reference_owner(ring: &Ring, hash: u64) -> usize {
        let n = ring.points.len() - 1;
        let i = ring.points[..n].partition_point(|&p| p < hash);
        ring.owners[if i == n { 0 } else { i }] as usize
    }

    #[test]
    fn members_are_sorted_and_unique() {
        let ring = Ring::new(&["node-c:7100", "node-a:7100", "node-b:7100", "node-a:7100"], 16);
        assert_eq!(ring.members(), ["node-a:7100", "node-b:7100", "node-c:7100"]);
        assert_eq!(ring.len(), 3);
        assert!(!ring.is_empty());
        assert_eq!(ring.index_of("node-b:7100"), Some(1));
        assert_eq!(ring.index_of("node-d:7100"), None);
        assert_eq!(ring.virtual_nodes(), 16);
        assert_eq!(ring.points.len(), 3 * 16 + 1);
    }

    #[test]
    fn one_member_owns_everything() {
        for ring in [Ring::with_one("127.0.0.1:7100"), Ring::new(&["127.0.0.1:7100"], DEFAULT_VIRTUAL_NODES)] {
            for h in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
                assert_eq!(ring.owner(h), 0);
            }
            assert_eq!(ring.shares(), vec![1.0]);
        }
    }

    #[test]
    fn zero_virtual_nodes_is_one() {
        let ring = Ring::new(&["a", "b"], 0);
        assert_eq!(ring.virtual_nodes(), 1);
        assert_eq!(ring.points.len(), 3);
    }

    #[test]
    fn owner_never_panics_at_the_edges() {
        for vn in [1, 2, 3, 64, 256, 1000] {
            let ring = Ring::new(&["a:1", "b:1", "c:1", "d:1", "e:1"], vn);
            let mut edges = vec![0, 1, 2, u64::MAX, u64::MAX - 1, 1 << 63, (1 << 63) - 1];
            for &p in &ring.points {
                edges.extend([p.wrapping_sub(1), p, p.wrapping_add(1)]);
            }
            for &t in &ring.slots {
                let start = (t as u64) << ring.shift;
                edges.extend([start.wrapping_sub(1), start, start.wrapping_add(1)]);
            }
            for slot in 0..ring.slots.len() as u64 {
                let start = slot.checked_shl(ring.shift).unwrap_or(0);
                edges.extend([start.wrapping_sub(1), start, start.wrapping_add(1)]);
            }
            for h in edges {
                let o = ring.owner(h);
                assert!(o < ring.len());
                assert_eq!(o, reference_owner(&ring, h), "hash {h:#x} with {vn} virtual nodes");
            }
        }
    }

    #[test]
    fn the_direct_index_agrees_with_binary_search() {
        let mut rng = sluice_testkit::Rng::from_env();
        for (members, vn) in [(2, 1), (3, 7), (3, 256), (8, 512), (17, 100)] {
            let names: Vec<String> = (0..members).map(|i| format!("10.0.0.{i}:7100")).collect();
            let ring = Ring::new(&names, vn);
            for _ in 0..100_000 {
                let h = rng.next_u64();
                assert_eq!(ring.owner(h), reference_owner(&ring, h));
            }
        }
    }

    #[test]
    fn a_hash_on_a_point_belongs_to_that_point() {
        let ring = Ring::new(&["a", "b", "c"], 8);
        for (j, &p) in ring.points[..ring.points.len() - 1].iter().enumerate() {
            assert_eq!(ring.owner(p), ring.owners[j] as usize);
        }
        // Past the last point: the first point's member.
        let last = ring.points[ring.points.len() - 2];
        if last < u64::MAX {
            assert_eq!(ring.owner(last + 1), ring.owners[0] as usize);
        }
    }

    #[test]
    fn points_are_pinned() {
        // Nodes of different builds must build the same ring: this value may never change.
        let mut buf = Vec::new();
        let mut expected = Vec::new();
        expected.extend_from_slice(&11u32.to_le_bytes());
        expected.extend_from_slice(b"node-a:7100");
        expected.extend_from_slice(&3u32.to_le_bytes());
        assert_eq!(point("node-a:7100", 3, &mut buf), xxh3_64(&expected));
        // And the encoding is unambiguous: the name's length comes first.
        assert_ne!(point("ab", 0, &mut buf), point("a", u32::from_le_bytes([b'b', 0, 0, 0]), &mut buf));
    }

    #[test]
    fn points_are_ordered_by_value_then_member_name() {
        // Equal points (never seen, but possible) must be ordered alike on every node: by
        // member id, which is the order of the names.
        let ring = Ring::new(&["b", "a"], 4);
        let n = ring.points.len() - 1;
        for j in 1..n {
            let (p0, p1) = (ring.points[j - 1], ring.points[j]);
            assert!(p0 < p1 || (p0 == p1 && ring.owners[j - 1] <= ring.owners[j]));
        }
    }

    #[test]
    fn shares_sum_to_one_and_are_even_at_the_default() {
        for n in 1..=8 {
            let names: Vec<String> = (0..n).map(|i| format!("node-{i}:7100")).collect();
            let ring = Ring::new(&names, DEFAULT_VIRTUAL_NODES);
            let shares = ring.shares();
            assert_eq!(shares.len(), n);
            assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{shares:?}");
            let fair = 1.0 / n as f64;
            for s in &shares {
                assert!((s - fair).abs() < 0.2 * fair, "{n} members: {shares:?}");
            }
        }
    }

    #[test]
    fn shares_match_a_sample() {
        let ring = Ring::new(&["x:1", "y:1", "z:1"], 64);
        let mut counts = [0u32; 3];
        // A fixed sample: the tolerance below is checked against it, not against every seed.
        let mut rng = sluice_testkit::Rng::with_seed(0x1234_5678_9abc_def1);
        let samples = 1_000_000;
        for _ in 0..samples {
            counts[ring.owner(rng.next_u64())] += 1;
        }
        for (count, share) in counts.iter().zip(ring.shares()) {
            assert!((*count as f64 / samples as f64 - share).abs() < 0.003, "{counts:?} {:?}", ring.shares());
        }
    }

    /// The spread of shares among three members, by points per member: the largest share over
    /// the smallest, for one named ring and as the mean and worst over 1000 random memberships.
    /// Run with `--nocapture` to see the table.
    #[test]
    fn share_spread_by_virtual_nodes() {
        let ratio = |ring: &Ring| {
            let s = ring.shares();
            s.iter().cloned().fold(0.0, f64::max) / s.iter().cloned().fold(1.0, f64::min)
        };
        let mut mean_at_default = 0.0;
        for vn in [16, 32, 64, 128, 256, 512, 1024] {
            let named = ratio(&Ring::new(&["node-a:7100", "node-b:7100", "node-c:7100"], vn));
            let (mut sum, mut worst) = (0.0, 0.0f64);
            let sets = 1000;
            for k in 0..sets {
                let names = [format!("10.{k}.0.1:7100"), format!("10.{k}.0.2:7100"), format!("10.{k}.0.3:7100")];
                let r = ratio(&Ring::new(&names, vn));
                sum += r;
                worst = worst.max(r);
            }
            let mean = sum / sets as f64;
            if vn == DEFAULT_VIRTUAL_NODES {
                mean_at_default = mean;
            }
            println!("virtual nodes {vn:5}: node-a/b/c {named:.3}, mean {mean:.3}, worst {worst:.3} of {sets}");
        }
        assert!(mean_at_default < 1.15, "mean max/min share ratio {mean_at_default}");
    }

    #[test]
    #[should_panic(expected = "without members")]
    fn an_empty_ring_owns_nothing() {
        let ring = Ring::new::<&str>(&[], 4);
        assert!(ring.is_empty());
        assert_eq!(ring.shares(), Vec::<f64>::new());
        ring.owner(7);
    }
}
