use super::*;

fn sample(secs: f64, bytes: u64, units: u64) -> Sample {
    Sample {
        secs,
        bytes,
        units,
        p50_us: 0.0,
        p99_us: 0.0,
    }
}

#[test]
fn figures_are_per_unit_of_work_with_both_proxies_cpu() {
    // 1 GB in 2 s with 3 s of proxy CPU: 4 Gb/s, 3 s per GB.
    let b = bulk(&sample(2.0, 1_000_000_000, 954), 3.0);
    assert_eq!((b.gbit_per_s, b.proxy_cpu_s_per_gb, b.mib), (4.0, 3.0, 954));
    // 2,000 round trips with 0.3 s of proxy CPU: 150 us each.
    let rt = round_trips(
        &Sample {
            p50_us: 180.0,
            p99_us: 300.0,
            ..sample(0.5, 0, 2000)
        },
        64,
        0.3,
    );
    assert_eq!(rt.proxy_cpu_us_per_round_trip, 150.0);
    assert_eq!((rt.p50_us, rt.p99_us, rt.size_bytes), (180.0, 300.0, 64));
    // 500 connections in 0.25 s with 0.4 s of proxy CPU: 2,000/s, 800 us each.
    let c = conns(&sample(0.25, 0, 500), 4, 0.4);
    assert_eq!(
        (c.per_s, c.proxy_cpu_us_per_conn, c.threads),
        (2000.0, 800.0, 4)
    );
    // Nothing measured is no division by zero.
    assert_eq!(bulk(&sample(0.0, 0, 0), 1.0).proxy_cpu_s_per_gb, 0.0);
    assert_eq!(conns(&sample(0.0, 0, 0), 1, 1.0).proxy_cpu_us_per_conn, 0.0);
}

fn arm(gbit: f64, p50: f64, p99: f64, per_s: f64) -> Arm {
    let rt = RoundTrips {
        size_bytes: 64,
        count: 10,
        p50_us: p50,
        p99_us: p99,
        proxy_cpu_us_per_round_trip: 0.0,
    };
    Arm {
        crosses: "x".into(),
        bulk: Some(Bulk {
            mib: 1,
            gbit_per_s: gbit,
            proxy_cpu_s: 0.0,
            proxy_cpu_s_per_gb: 0.0,
        }),
        rr_64b: Some(rt),
        rr_1kib: Some(RoundTrips {
            size_bytes: 1024,
            p50_us: p50 + 10.0,
            ..rt
        }),
        conns: Some(Conns {
            threads: 1,
            count: 10,
            per_s,
            proxy_cpu_us_per_conn: 0.0,
        }),
        conns_threads: Some(Conns {
            threads: 4,
            count: 12,
            per_s: per_s * 2.0,
            proxy_cpu_us_per_conn: 0.0,
        }),
        proxy_connections_opened: BTreeMap::new(),
    }
}

#[test]
fn ferry_is_compared_with_direct_as_ratios_and_added_latency() {
    let (d, f) = (
        arm(16.0, 30.0, 70.0, 8000.0),
        arm(4.0, 190.0, 370.0, 2000.0),
    );
    let r = ratios(&d, &f).expect("both arms measured everything");
    assert_eq!((r.bulk_throughput_x, r.conns_per_s_x), (0.25, 0.25));
    assert_eq!(
        (r.rr_64b_added_p50_us, r.rr_64b_added_p99_us),
        (160.0, 300.0)
    );
    assert_eq!(r.rr_1kib_added_p50_us, 160.0);
    assert_eq!(r.conns_threads_per_s_x, Some(0.25));
    let partial = Arm { conns: None, ..f };
    assert_eq!(ratios(&d, &partial), None);
}

#[test]
fn memory_per_idle_connection_counts_both_ends_against_idle() {
    let kib = |a: u64, b: u64| BTreeMap::from([("a".to_string(), a), ("b".to_string(), b)]);
    let mut m = Memory {
        idle_rss_kib: kib(7000, 8000),
        held_conns: 1000,
        held_rss_kib: kib(12000, 13000),
        after_close_rss_kib: kib(7500, 9000),
        ..Memory::default()
    };
    memory_figures(&mut m);
    assert_eq!(m.kib_per_idle_conn_both_ends, 10.0);
    assert_eq!(
        m.anon_kib_per_idle_conn_both_ends, 0.0,
        "no anonymous reading"
    );
    m.idle_anon_kib = kib(3000, 3500);
    m.held_anon_kib = kib(7000, 7500);
    memory_figures(&mut m);
    assert_eq!(m.anon_kib_per_idle_conn_both_ends, 8.0);
    assert!(
        memory_text_of(&m)
            .contains("anonymous a 7000 KiB, b 7500 KiB: 8.00 KiB per idle connection"),
        "{}",
        memory_text_of(&m)
    );
    assert_eq!(m.after_close_vs_idle_x, 1.1);
    assert_eq!(
        m.marginal_kib_per_idle_conn_both_ends, 0.0,
        "none held first, no marginal figure"
    );
    assert!(!memory_text_of(&m).contains("held first"));
    // 200 held first at 11,000 KiB: the 800 added 14,000 KiB, 17.5 KiB each, whatever the
    // idle proxies had given back (counted in held − idle).
    m.first_conns = 200;
    m.first_rss_kib = kib(5000, 6000);
    memory_figures(&mut m);
    assert_eq!(m.marginal_kib_per_idle_conn_both_ends, 17.5);
    assert!(
        memory_text_of(&m).contains(
            "200 held first: a 5000 KiB, b 6000 KiB; the 800 added to them: 17.50 KiB per idle connection, both ends"
        ),
        "{}",
        memory_text_of(&m)
    );
    assert_eq!(m.settled_vs_idle_x, 0.0, "no settled reading, no ratio");
    assert!(!memory_text_of(&m).contains("s after they closed"));
    m.settled_after_s = 60;
    m.settled_rss_kib = kib(7200, 8400);
    memory_figures(&mut m);
    assert_eq!(m.settled_vs_idle_x, 1.04);
    assert!(
        memory_text_of(&m).contains("60 s after they closed: a 7200 KiB, b 8400 KiB (1.04x idle)")
    );
}

fn memory_text_of(m: &Memory) -> String {
    let mut o = String::new();
    memory_text(&mut o, m);
    o
}

#[test]
fn the_json_names_every_figure_with_its_unit_and_the_text_what_each_arm_crosses() {
    let (mut d, mut f) = (
        arm(16.0, 30.0, 70.0, 8000.0),
        arm(4.0, 190.0, 370.0, 2000.0),
    );
    d.crosses = "pod veth -> bridge -> pod, no proxy".into();
    f.crosses = "source node proxy, HBONE mTLS, destination node proxy".into();
    f.proxy_connections_opened = BTreeMap::from([("alpha-1".to_string(), 12)]);
    let mut memory = Memory {
        held_conns: 10,
        ..Memory::default()
    };
    memory_figures(&mut memory);
    let report = Report {
        commit: Some("0123456789abcdef".into()),
        build_profile: "debug".into(),
        cpus: 2,
        topology: Topology {
            file: "lab.yaml".into(),
            from_pod: "sleep".into(),
            from_node: "alpha-1".into(),
            from_ip: "198.18.1.10".into(),
            to_pod: "echo-alpha-2".into(),
            to_node: "alpha-2".into(),
            to_ip: "198.18.2.20".into(),
            node_proxies: BTreeMap::from([("alpha-1".to_string(), 10), ("alpha-2".into(), 11)]),
        },
        pinned_cpu: Some(0),
        ferry_vs_direct: ratios(&d, &f),
        arms: BTreeMap::from([("direct".to_string(), d), ("ferry".to_string(), f)]),
        memory: Some(memory),
    };
    let json = serde_json::to_value(&report).unwrap();
    for path in [
        "/commit",
        "/topology/to_node",
        "/arms/ferry/bulk/proxy_cpu_s_per_gb",
        "/arms/ferry/bulk/gbit_per_s",
        "/arms/ferry/rr_64b/proxy_cpu_us_per_round_trip",
        "/arms/ferry/rr_1kib/p99_us",
        "/arms/ferry/conns/proxy_cpu_us_per_conn",
        "/arms/direct/proxy_connections_opened",
        "/ferry_vs_direct/rr_64b_added_p50_us",
        "/memory/kib_per_idle_conn_both_ends",
        "/memory/anon_kib_per_idle_conn_both_ends",
        "/memory/idle_rss_kib",
    ] {
        assert!(json.pointer(path).is_some(), "{path} in {json}");
    }
    let back: Report = serde_json::from_value(json).unwrap();
    assert_eq!(back.arms["ferry"].bulk, report.arms["ferry"].bulk);
    let text = report.text();
    for part in [
        "direct  crosses: pod veth -> bridge -> pod, no proxy",
        "ferry   crosses: source node proxy, HBONE mTLS, destination node proxy",
        "commit 0123456789ab",
        "pinned: client, both node proxies and the server app on CPU 0",
        "0.25x",
        "added +160/+300 us",
        "alpha-1 +12",
        "new conns x4",
        "16000/s",
    ] {
        assert!(text.contains(part), "{part:?} in:\n{text}");
    }
}
