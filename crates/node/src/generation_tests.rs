use std::path::Path;
use std::process::Command;

use netlink_packet_core::{ErrorMessage, NetlinkHeader};
use netlink_packet_netfilter::nftables::TableMessage;

use super::*;

/// `message` as the kernel would send it in reply to request `seq`.
fn reply(seq: u32, message: NfTablesMessage) -> Vec<u8> {
    let mut msg = NetlinkMessage::from(NetfilterMessage::new(
        NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, 0),
        message,
    ));
    msg.header.sequence_number = seq;
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    buf
}

fn new_gen(attributes: Vec<GenAttribute>) -> NfTablesMessage {
    NfTablesMessage::NewGen(GenMessage { attributes })
}

#[test]
fn the_kernels_generation_reply_gives_its_id() {
    let r = reply(
        7,
        new_gen(vec![
            GenAttribute::Id(0x0102_0304),
            GenAttribute::ProcPid(42),
            GenAttribute::ProcName("iptables-nft".into()),
        ]),
    );
    assert_eq!(parse(&r, 7).unwrap(), 0x0102_0304);
    // The request is what `nft` sends: NFT_MSG_GETGEN of subsystem nf_tables, a request.
    let q = request(9);
    assert_eq!(q.len(), 20);
    assert_eq!(u16::from_ne_bytes([q[4], q[5]]), 0x0a10);
    assert_eq!(u16::from_ne_bytes([q[6], q[7]]), NLM_F_REQUEST);
    assert_eq!(u32::from_ne_bytes([q[8], q[9], q[10], q[11]]), 9);
}

#[test]
fn short_cut_or_lying_replies_are_malformed_errors() {
    let good = reply(3, new_gen(vec![GenAttribute::Id(5)]));
    for bad in [
        Vec::new(),
        good[..10].to_vec(),
        good[..good.len() - 4].to_vec(),
        // A header that claims more than was received.
        {
            let mut b = good.clone();
            b[0] = 200;
            b
        },
        // An attribute whose length runs past the message.
        {
            let mut b = good.clone();
            let at = b.len() - 8;
            b[at] = 60;
            b
        },
    ] {
        match parse(&bad, 3) {
            Err(GenerationError::Malformed { len, .. }) => assert_eq!(len, bad.len()),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

#[test]
fn refusals_other_messages_and_a_missing_id_are_errors_naming_them() {
    let mut header = NetlinkHeader::default();
    header.sequence_number = 4;
    let mut error = ErrorMessage::default();
    error.code = std::num::NonZeroI32::new(-nix::libc::EPERM);
    let mut refused = NetlinkMessage::<NetfilterMessage>::new(header, NetlinkPayload::Error(error));
    refused.finalize();
    let mut buf = vec![0; refused.buffer_len()];
    refused.serialize(&mut buf);
    match parse(&buf, 4) {
        Err(GenerationError::Refused(e)) => {
            assert_eq!(e.raw_os_error(), Some(nix::libc::EPERM))
        }
        other => panic!("{other:?}"),
    }

    let table = reply(
        4,
        NfTablesMessage::NewTable(TableMessage { attributes: vec![] }),
    );
    assert!(
        matches!(parse(&table, 4), Err(GenerationError::Unexpected(_))),
        "{:?}",
        parse(&table, 4)
    );

    let no_id = reply(4, new_gen(vec![GenAttribute::ProcPid(1)]));
    assert!(matches!(parse(&no_id, 4), Err(GenerationError::NoId)));

    let other = reply(3, new_gen(vec![GenAttribute::Id(1)]));
    assert!(matches!(
        parse(&other, 4),
        Err(GenerationError::OtherRequest { sent: 4, got: 3 })
    ));
}

/// A network namespace of this test's, deleted when dropped.
struct TestNs(String);

impl TestNs {
    fn new(test: &str) -> Self {
        let name = format!("fg-{}-{test}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .expect("running ip");
        assert!(out.status.success(), "{out:?}");
        Self(name)
    }

    fn path(&self) -> String {
        format!("/var/run/netns/{}", self.0)
    }

    /// Runs `args` inside the namespace.
    fn run(&self, args: &[&str]) -> Result<(), String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

#[tokio::test]
async fn a_rule_added_in_a_namespace_moves_its_generation_and_no_other_namespaces() {
    if !nix::unistd::geteuid().is_root() || !nft_backend().await {
        eprintln!("skipping: needs root and iptables-nft");
        return;
    }
    let a = TestNs::new("gen-a");
    let b = TestNs::new("gen-b");
    let na = Netns::open(Path::new(&a.path())).unwrap();
    let nb = Netns::open(Path::new(&b.path())).unwrap();
    let ga = Generation::open(&na).await.unwrap();
    let gb = Generation::open(&nb).await.unwrap();
    let (a0, b0) = (ga.read(&na).await.unwrap(), gb.read(&nb).await.unwrap());
    // Asked again with nothing changed: the same (each request gets its own reply).
    assert_eq!(ga.read(&na).await.unwrap(), a0);

    let rule = [
        "iptables", "-w", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-j", "RETURN",
    ];
    b.run(&rule).unwrap();
    let b1 = gb.read(&nb).await.unwrap();
    assert_ne!(b1, b0, "a rule added in b moves b's generation");
    assert_eq!(ga.read(&na).await.unwrap(), a0, "and not a's");

    a.run(&rule).unwrap();
    let a1 = ga.read(&na).await.unwrap();
    assert_ne!(a1, a0, "a rule added in a moves a's generation");
    assert_eq!(gb.read(&nb).await.unwrap(), b1, "and not b's");

    // A deleted rule too (what a pod's own program could do to Ferry's).
    a.run(&[
        "iptables", "-w", "-t", "nat", "-D", "OUTPUT", "-p", "tcp", "-j", "RETURN",
    ])
    .unwrap();
    assert_ne!(ga.read(&na).await.unwrap(), a1);
}

#[test]
fn a_safety_check_compares_in_full_unless_the_generation_stood_still_and_routes_are_heard() {
    // Unchanged since the last good comparison, routing events heard: skipped.
    assert!(!compare_in_full(false, true, Some(7), Some(7)));
    // Moved, never compared, unreadable: compared.
    assert!(compare_in_full(false, true, Some(7), Some(8)));
    assert!(compare_in_full(false, true, None, Some(7)));
    assert!(compare_in_full(false, true, Some(7), None));
    assert!(compare_in_full(false, true, None, None));
    // No routing events: the routes are read every time.
    assert!(compare_in_full(false, false, Some(7), Some(7)));
    // A change event always.
    assert!(compare_in_full(true, true, Some(7), Some(7)));
}

#[test]
fn no_timer_runs_while_both_event_sockets_are_heard_under_iptables_nft() {
    assert!(!needs_safety_check(true, true, true));
    // Legacy iptables sends no nf_tables event; a lost socket hears none.
    assert!(needs_safety_check(false, true, true));
    assert!(needs_safety_check(true, false, true));
    assert!(needs_safety_check(true, true, false));
}
