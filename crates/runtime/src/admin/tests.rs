//! `/records` over real HTTP on loopback: whole, and followed as records are pushed.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;
use crate::records::Record;

/// How long anything here may take before the test fails.
const BOUND: Duration = Duration::from_secs(10);

fn record(id: &str, at_ms: u64) -> Record {
    Record {
        id: id.into(),
        at_ms,
        direction: "inbound".into(),
        verdict: "allowed",
        ..Record::default()
    }
}

/// A server on loopback answering `/records` from its own ring, with a short heartbeat.
async fn server() -> (std::net::SocketAddr, &'static Records) {
    let records: &'static Records = Box::leak(Box::new(Records::new(16)));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let routes = Routes::new().records(records, Duration::from_millis(50));
    tokio::spawn(serve(listener, routes));
    (addr, records)
}

/// Reads from `s` into `seen` until it contains every one of `wanted`.
async fn read_until(s: &mut TcpStream, seen: &mut String, wanted: &[&str]) {
    let deadline = Instant::now() + BOUND;
    let mut buf = [0u8; 4096];
    while !wanted.iter().all(|w| seen.contains(w)) {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, s.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{wanted:?} not read in time:\n{seen}"))
            .unwrap();
        assert!(n > 0, "the stream ended before {wanted:?}:\n{seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

/// Sends `request` on a new connection, reads the whole answer.
async fn whole(addr: std::net::SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(BOUND, s.read_to_string(&mut out))
        .await
        .unwrap()
        .unwrap();
    out
}

async fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + BOUND;
    while !f() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

#[tokio::test]
async fn a_follower_gets_each_record_pushed_after_it_subscribed_until_it_goes_away() {
    let (addr, records) = server().await;
    records.push(record("old-1", 1_000));
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /records?follow=1 HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let mut seen = String::new();
    read_until(&mut s, &mut seen, &["\r\n\r\n"]).await;
    assert!(seen.starts_with("HTTP/1.1 200 OK\r\n"), "{seen}");
    assert!(
        seen.contains("content-type: application/jsonl\r\n"),
        "{seen}"
    );
    assert!(seen.contains("transfer-encoding: chunked\r\n"), "{seen}");
    // Subscribed before the answer's head was sent.
    assert_eq!(records.followers(), 1);
    records.push(record("new-1", 2_000));
    records.push(record("new-2", 3_000));
    read_until(&mut s, &mut seen, &[r#""id":"new-1""#, r#""id":"new-2""#]).await;
    assert!(!seen.contains("old-1"), "no backlog without since:\n{seen}");
    let at = |id: &str| seen.find(id).unwrap_or(usize::MAX);
    assert!(at("new-1") < at("new-2"), "in push order:\n{seen}");

    // Meanwhile `/records` answers whole, and `since` keeps the newer ones.
    let all = whole(
        addr,
        "GET /records HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(all.starts_with("HTTP/1.1 200 OK\r\n"), "{all}");
    assert!(all.contains("content-length: "), "{all}");
    assert_eq!(
        all.split("\r\n\r\n").nth(1).unwrap_or("").lines().count(),
        3,
        "{all}"
    );
    let newer = whole(
        addr,
        "GET /records?since=2000 HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(
        newer.contains("new-1") && newer.contains("new-2"),
        "{newer}"
    );
    assert!(!newer.contains("old-1"), "{newer}");

    // The client goes away: the heartbeat's write fails and the stream's task ends.
    drop(s);
    assert!(
        eventually(|| records.followers() == 0).await,
        "the follower outlived its client"
    );
}

#[tokio::test]
async fn a_follower_with_since_gets_the_kept_records_first() {
    let (addr, records) = server().await;
    records.push(record("old-1", 1_000));
    records.push(record("old-2", 2_000));
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /records?follow=1&since=2000 HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let mut seen = String::new();
    read_until(&mut s, &mut seen, &[r#""id":"old-2""#]).await;
    records.push(record("new-1", 3_000));
    read_until(&mut s, &mut seen, &[r#""id":"new-1""#]).await;
    assert!(!seen.contains("old-1"), "{seen}");
    assert!(seen.find("old-2") < seen.find("new-1"), "{seen}");
}

#[tokio::test]
async fn a_bad_since_is_a_400_and_other_paths_ignore_the_query() {
    let (addr, _) = server().await;
    let r = whole(
        addr,
        "GET /records?follow=1&since=soon HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{r}");
    let r = whole(
        addr,
        "GET /nope?follow=1 HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 404 Not Found\r\n"), "{r}");
}

#[test]
fn the_records_query_is_parsed() {
    let q = |s: &str| RecordsQuery::parse(s);
    assert_eq!(q(""), Ok(RecordsQuery::default()));
    assert_eq!(
        q("follow=1&since=0"),
        Ok(RecordsQuery {
            follow: true,
            since_ms: Some(0)
        })
    );
    assert!(q("follow").is_ok_and(|q| q.follow));
    assert!(q("follow=0&x=y").is_ok_and(|q| !q.follow));
    assert!(q("since=-1").is_err());
}
