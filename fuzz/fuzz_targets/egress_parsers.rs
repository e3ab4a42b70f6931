//! What a step (or a client) sends the egress engine, parsed in the trusted process: a DNS
//! query (and our answer to it), an HTTP proxy request head, a TLS ClientHello's server name,
//! and a policy document (its canonical form must read back as itself).
#![no_main]
use libfuzzer_sys::fuzz_target;
use smithers_egress::{dns, proxy, Policy};

fuzz_target!(|data: &[u8]| {
    if let Ok(q) = dns::parse_query(data) {
        let reply = dns::respond(&q, dns::Answer::Address([127, 100, 0, 1].into()));
        assert!(reply.len() <= 512 + 16, "an answer larger than its question allows");
        let _ = dns::respond(&q, dns::Answer::NoSuchName);
    }
    let _ = proxy::parse_http_head(data);
    let _ = proxy::tls_server_name(data);
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(p) = Policy::from_json(text) {
            let again = Policy::from_json(&p.to_json().to_string()).expect("canonical form reads back");
            assert_eq!(again, p);
            let _ = p.decide("a.example.com", 443);
        }
        let _ = Policy::from_allow_hosts(&[text]);
    }
});
