//! Bad deliveries to the running endpoint get 4xx and never reach the SQLite events
//! queue; a good one is queued once however often it is retried.

use sandbox_core::webhook::WebhookVerifier;
use sandbox_e2e::{Harness, LifecycleHarness as _, Options};

fn now() -> u64 {
    agents_sim::real_unix_secs()
}

fn action_required() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "id": "evt_bad_1", "object": "event", "type": "agent.session.action_required",
        "created_at": now(),
        "data": {"id": "sess_unknown", "required_action": {"type": "environment_connection"}}
    }))
    .unwrap()
}

async fn post(url: &str, headers: &[(&str, String)], body: Vec<u8>) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new().post(url).body(body);
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or_default())
}

fn signed(id: &str, body: &[u8]) -> Vec<(&'static str, String)> {
    let ts = now();
    let sig = WebhookVerifier::new(agents_sim::DEFAULT_WEBHOOK_SECRET)
        .unwrap()
        .sign(id, ts, body);
    vec![
        ("webhook-id", id.to_owned()),
        ("webhook-timestamp", ts.to_string()),
        ("webhook-signature", sig),
        ("content-type", "application/json".to_owned()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_deliveries_get_4xx_and_never_reach_the_queue() {
    let h = Harness::start(Options {
        workers: 0,
        ..Options::default()
    })
    .await
    .unwrap();
    let url = h.stack().webhook_url();
    let body = action_required();

    let mut bad_sig = signed("msg_a", &body);
    bad_sig[2].1 = "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=".into();
    assert_eq!(post(&url, &bad_sig, body.clone()).await.0, 401);

    let mut tampered = body.clone();
    tampered[10] ^= 1;
    assert_eq!(post(&url, &signed("msg_b", &body), tampered).await.0, 401);

    let malformed = b"{\"id\": \"evt\", ".to_vec();
    assert_eq!(
        post(&url, &signed("msg_c", &malformed), malformed).await.0,
        400
    );

    let oversize = vec![b' '; (1 << 20) + 1];
    assert_eq!(
        post(&url, &signed("msg_d", &oversize), oversize).await.0,
        413
    );

    for missing in 0..3 {
        let mut hs = signed("msg_e", &body);
        hs.remove(missing);
        let (status, json) = post(&url, &hs, body.clone()).await;
        assert_eq!(status, 400, "{json}");
    }

    let old = {
        let ts = now() - 3600;
        let sig = WebhookVerifier::new(agents_sim::DEFAULT_WEBHOOK_SECRET)
            .unwrap()
            .sign("msg_f", ts, &body);
        vec![
            ("webhook-id", "msg_f".to_owned()),
            ("webhook-timestamp", ts.to_string()),
            ("webhook-signature", sig),
        ]
    };
    assert_eq!(post(&url, &old, body.clone()).await.0, 401);

    let stats = h.controller().events.stats().await.unwrap();
    assert_eq!(
        stats.visible + stats.in_flight + stats.delayed + stats.dead_letters,
        0,
        "{stats:?}"
    );

    // A good delivery retried three times is queued once (dedup = webhook-id).
    for _ in 0..3 {
        let (status, json) = post(&url, &signed("msg_good", &body), body.clone()).await;
        assert_eq!(status, 200, "{json}");
    }
    let stats = h.controller().events.stats().await.unwrap();
    assert_eq!(stats.visible, 1, "{stats:?}");
    h.shutdown().await.unwrap();
}
