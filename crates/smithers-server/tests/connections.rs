//! The connection layer against real TCP clients on 127.0.0.1: stalled and silent connections
//! are closed (slowloris), idle keep-alive connections too, the connection cap holds further
//! connections in the backlog without losing them, and shutdown is not held up by stalled
//! connections.
//!
//! No timing is asserted: every wait has a generous bound (10 s) that a correct server meets
//! by far, and only the outcome (closed, answered) is checked.

mod common;

use std::time::Duration;

use common::{small_limits, start_with, Host};
use smithers_server::Limits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Far more than any timeout configured below; only a server that never closes misses it.
const BOUND: Duration = Duration::from_secs(10);

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn limits(header_read_timeout: Duration, max_connections: usize) -> Limits {
    Limits {
        header_read_timeout,
        max_connections,
        ..small_limits()
    }
}

async fn connect(host: &Host) -> TcpStream {
    TcpStream::connect(host.base.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Reads until the server closes the connection (EOF or reset) and returns what it sent.
/// Panics if it is still open after [`BOUND`].
async fn read_until_closed(stream: &mut TcpStream, what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(BOUND, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                // A reset is a close too (the server dropped a socket with unread input).
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
                Err(e) => panic!("{what}: reading: {e}"),
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "{what}: the server did not close the connection within {BOUND:?}"
    );
    got
}

/// A client without a connection pool, so every check uses a fresh connection.
fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(BOUND)
        .build()
        .unwrap()
}

async fn health(host: &Host) -> reqwest::StatusCode {
    fresh_client()
        .get(host.url("/health"))
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn a_stalled_request_head_is_closed_and_the_server_stays_healthy() {
    let host = start_with(
        limits(Duration::from_millis(300), 1024),
        Duration::from_secs(5),
    )
    .await;
    let mut slow = connect(&host).await;
    // A request line and one header, then nothing: the head never ends.
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let got = read_until_closed(&mut slow, "partial head").await;
    // Whatever hyper answers before closing (a 408, or nothing), it never served the request.
    assert!(
        !String::from_utf8_lossy(&got).contains(" 200 "),
        "a half-sent request was answered: {}",
        String::from_utf8_lossy(&got)
    );
    assert_eq!(health(&host).await, 200);
    host.stop().await;
}

#[tokio::test]
async fn a_connection_that_never_sends_anything_is_closed() {
    let host = start_with(
        limits(Duration::from_millis(300), 1024),
        Duration::from_secs(5),
    )
    .await;
    let mut silent = connect(&host).await;
    let got = read_until_closed(&mut silent, "silent connection").await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    // Before the protocol is known (a prefix of the h2c preface) hyper's own header timer
    // does not run; the idle watchdog closes it as well.
    let mut prefix = connect(&host).await;
    prefix.write_all(&H2_PREFACE[..10]).await.unwrap();
    read_until_closed(&mut prefix, "h2c preface prefix").await;
    // And an h2c connection that opens no stream.
    let mut h2 = connect(&host).await;
    h2.write_all(H2_PREFACE).await.unwrap();
    read_until_closed(&mut h2, "h2c connection without streams").await;
    assert_eq!(health(&host).await, 200);
    host.stop().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_its_response() {
    let host = start_with(
        limits(Duration::from_millis(300), 1024),
        Duration::from_secs(5),
    )
    .await;
    let mut conn = connect(&host).await;
    conn.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    // The request is answered, then the connection (kept alive by HTTP/1.1) is closed once
    // idle.
    let got = read_until_closed(&mut conn, "idle keep-alive connection").await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
    assert!(text.contains("\"status\":\"ok\""), "{text}");
    host.stop().await;
}

#[tokio::test]
async fn a_slow_request_body_is_not_cut_by_the_header_timeout() {
    // The header timeout is about heads and idle connections; a request in progress (here a
    // body sent in pieces, slower than the header timeout) is the routes' deadline's business.
    let host = start_with(
        limits(Duration::from_millis(300), 1024),
        Duration::from_secs(5),
    )
    .await;
    let body = br#"{"sandboxId":"slow-body","runId":"run-1"}"#;
    let mut conn = connect(&host).await;
    let head = format!(
        "POST /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        common::TOKEN,
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let (first, rest) = body.split_at(10);
    conn.write_all(first).await.unwrap();
    // Longer than the header timeout: a head-or-idle timer would close the connection here.
    tokio::time::sleep(Duration::from_millis(900)).await;
    conn.write_all(rest).await.unwrap();
    let got = read_until_closed(&mut conn, "slow body").await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 201 "), "{text}");
    host.stop().await;
}

#[tokio::test]
async fn stalled_connections_over_the_cap_do_not_lock_out_a_good_client() {
    let host = start_with(
        limits(Duration::from_millis(300), 4),
        Duration::from_secs(5),
    )
    .await;
    // Six stalled connections against a cap of four: four are served (and time out), two
    // wait in the backlog behind them, then are served and time out in turn.
    let mut stalled = Vec::new();
    for i in 0..6 {
        let mut s = connect(&host).await;
        if i % 2 == 0 {
            s.write_all(b"GET /health HTTP/1.1\r\n").await.unwrap();
        }
        stalled.push(s);
    }
    // A well-behaved client behind them is answered once slots free up.
    assert_eq!(health(&host).await, 200);
    for (i, s) in stalled.iter_mut().enumerate() {
        read_until_closed(s, &format!("stalled connection {i}")).await;
    }
    // The cap held: never more than four connections were served at once.
    let metrics = fresh_client()
        .get(host.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let open: i64 = gauge(&metrics, "smithers_server_connections_open");
    assert!((1..=4).contains(&open), "{open} open connections");
    let accepted: i64 = gauge(&metrics, "smithers_server_connections_accepted_total");
    assert!(accepted >= 8, "{accepted} connections accepted");
    host.stop().await;
}

#[tokio::test]
async fn at_the_cap_a_new_connection_waits_until_a_slot_frees() {
    // A long header timeout: the two stalled connections keep their slots until they go.
    let host = start_with(limits(Duration::from_secs(60), 2), Duration::from_secs(5)).await;
    let mut a = connect(&host).await;
    a.write_all(b"GET /health HTTP/1.1\r\n").await.unwrap();
    let b = connect(&host).await;
    // Accepted in order, so `a` and `b` hold both slots and this request waits.
    let waiting = tokio::spawn({
        let url = host.url("/health");
        async move { fresh_client().get(url).send().await.map(|r| r.status()) }
    });
    // Not answered while the slots are taken (a correct server never answers here, so this
    // wait cannot fail spuriously; a server without the cap answers well within it).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "answered above the cap: {:?}",
        waiting.await
    );
    // Closing one stalled connection frees a slot: the waiting request is served, not lost.
    drop(a);
    let status = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("the waiting request was not served after a slot freed")
        .unwrap()
        .unwrap();
    assert_eq!(status, 200);
    drop(b);
    host.stop().await;
}

#[tokio::test]
async fn shutdown_is_not_held_up_by_stalled_connections() {
    // Silent connections and a stalled h2c preface end at once on shutdown; a half-sent
    // HTTP/1 head is closed by the header timeout at the latest (short here).
    let host = start_with(limits(Duration::from_secs(2), 1024), Duration::from_secs(5)).await;
    let mut silent = connect(&host).await;
    let mut prefix = connect(&host).await;
    prefix.write_all(&H2_PREFACE[..10]).await.unwrap();
    let mut partial = connect(&host).await;
    partial
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    // Make sure the server holds all three before stopping it.
    assert_eq!(health(&host).await, 200);
    tokio::time::timeout(BOUND, host.stop())
        .await
        .expect("shutdown waited on stalled connections");
    read_until_closed(&mut silent, "silent connection at shutdown").await;
    read_until_closed(&mut prefix, "preface prefix at shutdown").await;
    read_until_closed(&mut partial, "partial head at shutdown").await;
}

fn gauge(metrics: &str, name: &str) -> i64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from\n{metrics}"))
}

#[tokio::test]
async fn h2c_is_served_and_an_idle_h2c_connection_is_closed() {
    let host = start_with(
        limits(Duration::from_millis(300), 1024),
        Duration::from_secs(5),
    )
    .await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(BOUND)
        .build()
        .unwrap();
    let r = h2.get(host.url("/health")).send().await.unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 200);
    let r = h2
        .get(host.url("/v1/sandboxes"))
        .bearer_auth(common::TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Raw h2c: preface and an empty SETTINGS frame, then silence. The server answers with its
    // SETTINGS and, once the connection has been idle for the timeout, closes it.
    let mut conn = connect(&host).await;
    conn.write_all(H2_PREFACE).await.unwrap();
    conn.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let got = read_until_closed(&mut conn, "idle h2c connection").await;
    assert!(
        got.len() >= 9 && got[3] == 4,
        "no SETTINGS frame first: {got:?}"
    );
    // A GOAWAY frame (type 7) precedes the close.
    assert!(has_frame(&got, 7), "no GOAWAY before the close: {got:?}");
    // The pooled h2 client notices and reconnects.
    let r = h2.get(host.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    host.stop().await;
}

/// Whether the HTTP/2 frames in `bytes` include one of `kind`.
fn has_frame(bytes: &[u8], kind: u8) -> bool {
    let mut at = 0;
    while at + 9 <= bytes.len() {
        let len = u32::from_be_bytes([0, bytes[at], bytes[at + 1], bytes[at + 2]]) as usize;
        if bytes[at + 3] == kind {
            return true;
        }
        at += 9 + len;
    }
    false
}
