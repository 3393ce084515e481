use std::io::ErrorKind;

use ferry_core::authz::{Effect, Reason};

use super::*;

/// A denial, as the tests of connections need one: one ALLOW policy applies, none matches.
pub(crate) fn denial() -> Denial {
    Denial(Verdict {
        effect: Effect::Deny,
        reason: Reason::NoAllowMatched { allow_policies: 1 },
        audited: Vec::new(),
        dry_run: Vec::new(),
    })
}

fn copy(failed: Failed, kind: ErrorKind) -> CopyError {
    CopyError {
        failed,
        source: io::Error::new(kind, "test"),
        a_to_b: 3,
        b_to_a: 4,
    }
}

fn addr() -> SocketAddr {
    "198.18.2.20:8080".parse().unwrap()
}

#[test]
fn each_failure_has_its_side_and_flag() {
    use ResponseFlag::*;
    use Side::*;
    let refused = io::Error::from(ErrorKind::ConnectionRefused);
    let table: Vec<(ConnError, Side, ResponseFlag)> = vec![
        (
            HboneError::Connect {
                addr: addr(),
                source: io::Error::from(ErrorKind::ConnectionRefused),
            }
            .into(),
            Upstream,
            ConnectionFailure,
        ),
        (
            HboneError::BadAuthority("x".into()).into(),
            Local,
            ConnectionFailure,
        ),
        (
            RouteError::UnknownHost {
                hostname: "a.b".into(),
            }
            .into(),
            Local,
            NoRoute,
        ),
        (
            ConnError::tunnel("inner", HboneError::BadAuthority("x".into())),
            Local,
            ConnectionFailure,
        ),
        (InboundError::LeftMesh.into(), Local, NoRoute),
        (RecursiveCall(addr()).into(), Downstream, NoRoute),
        (denial().into(), Local, Deny),
        (ConnError::policy_changed(denial(), (1, 2)), Local, Deny),
        (
            ConnError::connect(addr(), refused),
            Upstream,
            ConnectionFailure,
        ),
        (
            ConnError::no_original_dst(io::Error::other("none")),
            Local,
            NoRoute,
        ),
        (ConnError::source_left(), Local, NoRoute),
        (
            copy(Failed::A, ErrorKind::ConnectionReset).into(),
            Downstream,
            DownstreamTermination,
        ),
        (
            copy(Failed::B, ErrorKind::ConnectionReset).into(),
            Upstream,
            UpstreamTermination,
        ),
        (
            copy(Failed::A, ErrorKind::TimedOut).into(),
            Local,
            IdleTimeout,
        ),
        (
            copy(Failed::B, ErrorKind::TimedOut).into(),
            Local,
            IdleTimeout,
        ),
    ];
    for (e, side, flag) in table {
        assert_eq!((e.side, e.flag), (side, flag), "{e}");
    }
}

#[test]
fn a_relay_error_seen_by_reference_keeps_its_side_kind_and_counts() {
    let e = RelayError {
        copy: copy(Failed::B, ErrorKind::ConnectionReset),
        reset: ferry_hbone::copy::Resets { a: true, b: false },
    };
    let c = ConnError::from(&e);
    assert_eq!(c.moved(), (3, 4));
    assert_eq!(
        (c.side, c.flag),
        (Side::Upstream, ResponseFlag::UpstreamTermination)
    );
    match c.kind {
        ConnErrorKind::Relay {
            a_to_b: 3,
            b_to_a: 4,
            source,
            ..
        } => assert_eq!(source.kind(), ErrorKind::ConnectionReset),
        other => panic!("{other:?}"),
    }
}

#[test]
fn messages_say_which_side_failed() {
    let e = ConnError::connect(addr(), io::Error::from(ErrorKind::ConnectionRefused));
    assert!(
        e.to_string()
            .starts_with("upstream side failed: TCP connect to 198.18.2.20:8080 failed"),
        "{e}"
    );
    let e = ConnError::from(copy(Failed::A, ErrorKind::ConnectionReset));
    assert!(
        e.to_string()
            .starts_with("downstream side failed: the downstream failed after 3 bytes sent"),
        "{e}"
    );
    let e = ConnError::from(denial());
    assert_eq!(
        e.to_string(),
        format!("local side failed: {}", denial().0),
        "{e}"
    );
}

#[test]
fn flags_are_the_strings_operators_filter_on() {
    use ResponseFlag::*;
    let strings: Vec<&str> = [
        None,
        Deny,
        NoRoute,
        ConnectionFailure,
        UpstreamTermination,
        DownstreamTermination,
        IdleTimeout,
    ]
    .into_iter()
    .map(ResponseFlag::as_str)
    .collect();
    assert_eq!(
        strings,
        [
            "-",
            "DENY",
            "NoRoute",
            "ConnectionFailure",
            "UpstreamConnectionTermination",
            "DownstreamConnectionTermination",
            "StreamIdleTimeout"
        ]
    );
}

#[test]
fn refusals_keep_their_http_mapping() {
    assert_eq!(ConnError::from(denial()).refusal().status(), 401);
    assert_eq!(
        ConnError::from(RecursiveCall(addr())).refusal().status(),
        400
    );
    assert_eq!(
        ConnError::from(InboundError::LeftMesh).refusal().status(),
        503
    );
    assert_eq!(
        ConnError::connect(addr(), io::Error::from(ErrorKind::ConnectionRefused))
            .refusal()
            .status(),
        503
    );
}

#[test]
fn only_a_next_hop_that_could_not_be_reached_is_retried() {
    let refused = |status| HboneError::Refused {
        addr: addr(),
        authority: "x".into(),
        status,
    };
    let retried: Vec<ConnError> = vec![
        ConnError::connect(addr(), io::Error::from(ErrorKind::ConnectionRefused)),
        HboneError::Connect {
            addr: addr(),
            source: io::Error::from(ErrorKind::ConnectionReset),
        }
        .into(),
        HboneError::Handshake {
            addr: addr(),
            source: io::Error::from(ErrorKind::ConnectionReset),
        }
        .into(),
        HboneError::Timeout {
            doing: "connecting",
            after_ms: 5,
        }
        .into(),
        refused(503).into(),
        ConnError::tunnel("inner tunnel through the gateway", refused(503)),
    ];
    for e in &retried {
        assert!(e.retryable(), "{e}");
    }
    let kept: Vec<ConnError> = vec![
        refused(403).into(),
        refused(400).into(),
        ConnError::from(denial()),
        RouteError::UnknownHost {
            hostname: "a.b".into(),
        }
        .into(),
        HboneError::BadAuthority("x".into()).into(),
        ConnError::from(copy(Failed::B, ErrorKind::ConnectionReset)),
    ];
    for e in &kept {
        assert!(!e.retryable(), "{e}");
    }
}
