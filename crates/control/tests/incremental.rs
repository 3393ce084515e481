//! Edits applied incrementally equal a full rebuild: random sequences of edits of a topology
//! file's text (workloads changed, added, removed, moved, commented, made invalid; services and
//! policies changed), each reloaded as the watcher reloads it (`source::reload`: through the
//! kept text when only workload entries changed, from the resources served before) and each
//! against a full parse and a whole encoding of the same text. The snapshot, and every resource
//! served (name, version, bytes), must be equal; a rejected edit must be rejected with the same
//! error. Seeded (`ferry_core::testing::Gen`): a failure names its seed and step.

use ferry_control::served::Served;
use ferry_control::source::reload;
use ferry_core::random::SplitMix64;
use ferry_core::testing::Gen;
use ferry_topology::Limits;
use ferry_topology::kept::parse_kept;

const SEEDS: u64 = 48;
const STEPS: usize = 40;

/// The part of the file before the workloads. With `nested`, a service whose endpoint is
/// another's VIP (flattened when served), so edits take the path that flattens again.
fn header(nested: bool, version: usize) -> String {
    let mut t = String::from(
        "trust_domain: cluster.local\n\
         clusters:\n  - {name: east, network: net-east}\n  - {name: west, network: net-west}\n\
         nodes:\n",
    );
    for n in 0..4 {
        let c = if n % 2 == 0 { "east" } else { "west" };
        t.push_str(&format!(
            "  - {{name: node{n}, cluster: {c}, locality: {{region: r{}, zone: z{n}}}}}\n",
            n % 2
        ));
    }
    t.push_str(
        "waypoints:\n  - name: wp\n    for: all\n    instances:\n      - {name: wp-1, node: node0, address: 198.18.9.1}\n",
    );
    t.push_str("services:\n");
    for s in 0..4 {
        let net = if s % 2 == 0 { "net-east" } else { "net-west" };
        let scope = if (s + version).is_multiple_of(3) {
            "local"
        } else {
            "global"
        };
        t.push_str(&format!(
            "  - name: svc{s}\n    vips: [{{network: {net}, address: 198.19.0.{}}}]\n    ports: [{{port: 80, target_port: 8080}}, {{port: 81, target_port_name: http}}]\n    selector: {{app: svc{s}}}\n    scope: {scope}\n",
            s + 1
        ));
        if s == 3 {
            t.push_str("    waypoint: wp\n");
        }
    }
    if nested {
        t.push_str(
            "  - name: outer\n    vips: [{network: net-east, address: 198.19.0.9}]\n    ports: [{port: 80, target_port: 80}]\n    scope: global\n    endpoints:\n      - {address: 198.19.0.1, cluster: east, ports: {80: 80}}\n",
        );
    }
    t
}

fn policies(version: usize) -> String {
    let mut t = String::from("policies:\n");
    t.push_str("  - {name: allow-default, namespace: default, action: allow, rules: [{from: [{namespaces: [default]}]}]}\n");
    t.push_str(&format!(
        "  - name: deny-admin\n    selector: {{app: svc{}}}\n    action: deny\n    rules:\n      - to: [{{ports: [81], methods: [POST], paths: [\"/admin*\"]}}]\n",
        version % 4
    ));
    t.push_str("  - {name: deny-9000, selector: {app: svc1}, action: deny, rules: [{to: [{ports: [9000]}]}]}\n");
    t
}

/// One workload entry, in flow or block style.
fn entry(g: &mut Gen, name: &str, address: &str) -> String {
    let node = g.below(4);
    let app = g.below(5); // svc4 selects nothing
    let sa = g.below(3);
    let capacity = 1 + g.below(3);
    let named = if g.chance(30) {
        ", ports: {http: 8081}"
    } else {
        ""
    };
    let waypoint = if g.chance(10) { ", waypoint: wp" } else { "" };
    if g.chance(70) {
        format!(
            "  - {{name: {name}, service_account: sa{sa}, node: node{node}, address: {address}, capacity: {capacity}, labels: {{app: svc{app}}}{named}{waypoint}}}\n"
        )
    } else {
        let comment = if g.chance(30) { "    # a note\n" } else { "" };
        format!(
            "  - name: {name}\n{comment}    service_account: sa{sa}\n    node: node{node}\n    address: {address}\n    capacity: {capacity}\n    labels:\n      app: svc{app}\n"
        )
    }
}

struct Doc {
    nested: bool,
    version: usize,
    header: String,
    entries: Vec<String>,
    next: usize,
}

impl Doc {
    fn text(&self) -> String {
        format!(
            "{}workloads:\n{}{}",
            self.header,
            self.entries.concat(),
            policies(self.version)
        )
    }

    fn address(&mut self, g: &mut Gen) -> String {
        // Few addresses: a new one sometimes clashes with another workload's (rejected).
        format!("198.18.{}.{}", g.below(2), 1 + g.below(40))
    }

    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("pod{}", self.next)
    }

    /// One random edit.
    fn edit(&mut self, g: &mut Gen) {
        let n = self.entries.len();
        match g.below(100) {
            // Change a workload (node, labels, service account, capacity, style).
            0..=39 if n > 0 => {
                let i = g.below(n);
                let name = entry_name(&self.entries[i]);
                let address = entry_address(&self.entries[i]);
                self.entries[i] = entry(g, &name, &address);
            }
            40..=54 => {
                let name = self.fresh();
                let address = self.address(g);
                let at = g.below(n + 1);
                let e = entry(g, &name, &address);
                self.entries.insert(at, e);
            }
            55..=64 if n > 1 => {
                self.entries.remove(g.below(n));
            }
            // Move one.
            65..=69 if n > 1 => {
                let e = self.entries.remove(g.below(n));
                let at = g.below(n);
                self.entries.insert(at, e);
            }
            // A new address (clashes now and then).
            70..=74 if n > 0 => {
                let i = g.below(n);
                let name = entry_name(&self.entries[i]);
                let address = self.address(g);
                self.entries[i] = entry(g, &name, &address);
            }
            // A name given twice (the uid is then too).
            75..=77 if n > 0 => {
                let name = entry_name(&self.entries[g.below(n)]);
                let address = self.address(g);
                let e = entry(g, &name, &address);
                let at = g.below(n + 1);
                self.entries.insert(at, e);
            }
            // A comment between entries.
            78..=80 => {
                let at = g.below(n + 1);
                self.entries.insert(at, "  # a comment\n".to_string());
            }
            // Broken YAML in an entry.
            81..=82 if n > 0 => {
                let i = g.below(n);
                self.entries[i] = "  - {name: broken, node: node0\n".to_string();
            }
            // A service or a policy changes: a full parse.
            83..=90 => {
                self.version += 1;
                self.header = header(self.nested, self.version);
            }
            // Two workloads changed at once, far apart.
            _ if n > 2 => {
                for i in [0, n - 1] {
                    let name = entry_name(&self.entries[i]);
                    let address = entry_address(&self.entries[i]);
                    self.entries[i] = entry(g, &name, &address);
                }
            }
            _ => {}
        }
        // Entries that are not workloads anymore (a broken one or a comment) are removed by
        // later edits now and then, so the file becomes valid again.
        if g.chance(30) {
            self.entries
                .retain(|e| !e.contains("broken") && !e.trim_start().starts_with('#'));
        }
    }
}

fn field(e: &str, key: &str) -> String {
    let at = e.find(key).unwrap_or_else(|| panic!("{key} in {e}")) + key.len();
    e[at..]
        .trim_start()
        .split([',', '}', '\n'])
        .next()
        .unwrap()
        .trim()
        .to_string()
}

fn entry_name(e: &str) -> String {
    if e.contains("broken") || !e.contains("name:") {
        return "broken-was".into();
    }
    field(e, "name:")
}

fn entry_address(e: &str) -> String {
    if !e.contains("address:") {
        return "198.18.7.7".into();
    }
    field(e, "address:")
}

#[test]
fn edits_applied_incrementally_equal_a_full_rebuild() {
    let limits = Limits::default();
    let (mut incremental, mut valid) = (0, 0);
    for seed in 0..SEEDS {
        let mut g = Gen(SplitMix64::new(seed));
        let nested = seed % 4 == 3;
        let mut doc = Doc {
            nested,
            version: 0,
            header: header(nested, 0),
            entries: Vec::new(),
            next: 0,
        };
        for i in 0..12 {
            let name = doc.fresh();
            let address = format!("198.18.{}.{}", i % 2, 100 + i);
            let e = entry(&mut g, &name, &address);
            doc.entries.push(e);
        }
        let (first, mut kept) = parse_kept("t.yaml", doc.text(), &limits)
            .unwrap_or_else(|e| panic!("seed {seed}: the first file: {e}"));
        let mut served = Served::new(&first.snapshot);
        for step in 0..STEPS {
            doc.edit(&mut g);
            let text = doc.text();
            let full = ferry_topology::parse_within("t.yaml", &text, &limits);
            let got = reload("t.yaml", text.clone(), &limits, &mut kept, Some(&served));
            let at = format!("seed {seed} step {step}");
            match (got, full) {
                (Ok(got), Ok(full)) => {
                    valid += 1;
                    incremental += usize::from(got.incremental);
                    assert!(
                        got.topology.snapshot == full.snapshot,
                        "{at}: the snapshot differs from a full parse (incremental: {})\n{text}",
                        got.incremental
                    );
                    let next = got.served.expect("served");
                    let whole = Served::new(&full.snapshot);
                    assert_eq!(
                        next.resources().by_type,
                        whole.resources().by_type,
                        "{at}: the resources differ from a whole encoding (incremental: {})",
                        got.incremental
                    );
                    served = next;
                }
                (Err(got), Err(full)) => {
                    assert_eq!(got.to_string(), full.to_string(), "{at}: another error");
                }
                (got, full) => panic!(
                    "{at}: incremental {:?} but full {:?}\n{text}",
                    got.map(|r| r.incremental),
                    full.map(|_| ())
                ),
            }
        }
    }
    // The incremental path was taken, and not only it.
    assert!(
        incremental * 3 > valid && incremental < valid,
        "{incremental} of {valid} valid edits incremental"
    );
}
