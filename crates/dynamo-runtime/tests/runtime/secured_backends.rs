//! NATS with authorization (`NATS_AUTH_*`: user and password, token, nkey) and etcd over
//! TLS with client certificates (`ETCD_AUTH_CA`, `ETCD_AUTH_CLIENT_CERT`,
//! `ETCD_AUTH_CLIENT_KEY`), against real servers started by the test.

use std::sync::Arc;

use bytes::Bytes;
use dynamo_runtime::config::{DiscoveryBackend, EtcdTls, EventPlane, NatsAuth, RequestPlane};
use dynamo_runtime::events::EventScope;
use dynamo_runtime::transport::server::{Handler, Request, Responder};
use dynamo_runtime::{DistributedRuntime, EndpointId, Error, Route, RuntimeConfig};

use crate::common::{WAIT, etcd_server_tls, nats_server_with_config};

/// Replies with the request body, then ends.
struct Echo;

impl Handler for Echo {
    fn start(&self, request: Request, mut out: Responder) {
        let _ = out.send(&request.body);
        out.finish();
    }
}

fn nats_config(port: u16, auth: NatsAuth) -> RuntimeConfig {
    RuntimeConfig {
        event_plane: Some(EventPlane::Nats),
        nats_server: format!("nats://127.0.0.1:{port}"),
        nats_server_set: true,
        nats_auth: auth,
        ..RuntimeConfig::default()
    }
}

fn nats_runtime(port: u16, auth: NatsAuth) -> DistributedRuntime {
    DistributedRuntime::new(
        DiscoveryBackend::Mem,
        RequestPlane::Nats,
        nats_config(port, auth),
    )
    .expect("runtime")
}

/// With the right credentials both planes work: a request over the NATS request plane and
/// an event over the NATS event plane.
async fn both_planes_work(port: u16, auth: NatsAuth, ns: &str) {
    let (worker, caller) = (nats_runtime(port, auth.clone()), nats_runtime(port, auth));
    let ep = EndpointId::parse(&format!("{ns}.backend.generate")).expect("name");
    let serving = {
        let (worker, ep) = (worker.clone(), ep.clone());
        tokio::spawn(async move { worker.serve_endpoint(&ep, Arc::new(Echo), true).await })
    };
    let client = caller.client(&ep);
    tokio::time::timeout(WAIT, client.wait_for_instances())
        .await
        .expect("instance in time")
        .expect("instances");
    let body = Bytes::from_static(b"\"hello\"");
    let mut stream = client
        .generate(body.clone(), Route::RoundRobin, Default::default(), None)
        .await
        .expect("request accepted");
    assert_eq!(stream.next().await.expect("item").expect("ok"), body);
    assert!(stream.next().await.is_none());

    let scope = EventScope::namespace(ns);
    let mut sub = caller.subscribe(&scope, "t").await.expect("subscribe");
    let publisher = worker
        .event_publisher(&scope, "t")
        .await
        .expect("publisher");
    let event = tokio::time::timeout(WAIT, async {
        loop {
            publisher.publish_value(&7u32).expect("publish");
            tokio::select! {
                e = sub.next() => break e.expect("subscription open"),
                () = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
            }
        }
    })
    .await
    .expect("event in time");
    assert_eq!(event.decode::<u32>().expect("u32"), 7);

    worker.shutdown();
    tokio::time::timeout(WAIT, serving)
        .await
        .expect("serve ends")
        .expect("task")
        .expect("served");
    caller.shutdown();
    tokio::time::timeout(WAIT, caller.stopped())
        .await
        .expect("stopped");
}

/// With wrong or missing credentials both planes fail at once with `NatsAuth`, naming the
/// variables the credentials came from.
async fn both_planes_refused(port: u16, auth: NatsAuth, source: &str) {
    let rt = nats_runtime(port, auth);
    let ep = EndpointId::parse("refused.backend.generate").expect("name");
    let served = tokio::time::timeout(WAIT, rt.serve_endpoint(&ep, Arc::new(Echo), true))
        .await
        .expect("fails at once");
    let subscribed = tokio::time::timeout(WAIT, rt.subscribe(&EventScope::namespace("x"), "t"))
        .await
        .expect("fails at once");
    for err in [served.err(), subscribed.err()] {
        let err = err.expect("refused");
        assert!(matches!(err, Error::NatsAuth(_)), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("authorization") && msg.contains(source),
            "{msg}"
        );
    }
    rt.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_user_and_password() {
    let server =
        nats_server_with_config("authorization { user: alice, password: \"s3cret pw\" }\n");
    let user = |user: &str, password: &str| NatsAuth::UserPassword {
        user: user.into(),
        password: password.into(),
    };
    both_planes_work(server.port, user("alice", "s3cret pw"), "natsuser").await;
    both_planes_refused(
        server.port,
        user("alice", "wrong"),
        "NATS_AUTH_USERNAME/NATS_AUTH_PASSWORD",
    )
    .await;
    both_planes_refused(server.port, NatsAuth::None, "no NATS_AUTH_* variable set").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_token() {
    let server = nats_server_with_config("authorization { token: \"t0ken-123\" }\n");
    both_planes_work(
        server.port,
        NatsAuth::Token("t0ken-123".into()),
        "natstoken",
    )
    .await;
    both_planes_refused(
        server.port,
        NatsAuth::Token("t0ken-456".into()),
        "NATS_AUTH_TOKEN",
    )
    .await;
    both_planes_refused(server.port, NatsAuth::None, "no NATS_AUTH_* variable set").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_nkey() {
    let user = nkeys::KeyPair::new_user();
    let other = nkeys::KeyPair::new_user();
    let server = nats_server_with_config(&format!(
        "authorization {{ users: [ {{ nkey: {} }} ] }}\n",
        user.public_key()
    ));
    let seed = |k: &nkeys::KeyPair| NatsAuth::Nkey(k.seed().expect("seed"));
    both_planes_work(server.port, seed(&user), "natsnkey").await;
    both_planes_refused(server.port, seed(&other), "NATS_AUTH_NKEY").await;
    both_planes_refused(
        server.port,
        NatsAuth::Nkey("not-a-seed".into()),
        "NATS_AUTH_NKEY",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_missing_credentials_file_is_named() {
    let server = nats_server_with_config("authorization { token: \"t\" }\n");
    let rt = nats_runtime(
        server.port,
        NatsAuth::CredentialsFile("/nonexistent/user.creds".into()),
    );
    let Err(err) = rt.subscribe(&EventScope::namespace("x"), "t").await else {
        panic!("refused");
    };
    assert!(matches!(err, Error::NatsAuth(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("/nonexistent/user.creds") && msg.contains("NATS_AUTH_CREDENTIALS_FILE"),
        "{msg}"
    );
    rt.shutdown();
}

fn etcd_tls_config(port: u16, tls: EtcdTls) -> RuntimeConfig {
    RuntimeConfig {
        etcd_endpoints: vec![format!("https://127.0.0.1:{port}")],
        etcd_endpoints_set: true,
        etcd_lease_ttl: std::time::Duration::from_secs(5),
        etcd_tls: tls,
        ..RuntimeConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_tls_with_client_certificates() {
    let (etcd, pki) = etcd_server_tls();
    let connect = |tls: EtcdTls| {
        DistributedRuntime::connect(
            DiscoveryBackend::Etcd,
            RequestPlane::Tcp,
            etcd_tls_config(etcd.port, tls),
        )
    };
    let full = EtcdTls {
        ca: Some(pki.ca.clone()),
        client_cert: Some(pki.client_cert.clone()),
        client_key: Some(pki.client_key.clone()),
    };
    let (a, b) = (
        connect(full.clone()).await.expect("connects over TLS"),
        connect(full.clone()).await.expect("connects over TLS"),
    );
    // Discovery works over TLS: b serves, a finds it and calls it.
    let ep = EndpointId::parse("etcdtls.backend.generate").expect("name");
    let serving = {
        let (b, ep) = (b.clone(), ep.clone());
        tokio::spawn(async move { b.serve_endpoint(&ep, Arc::new(Echo), true).await })
    };
    let client = a.client(&ep);
    let ids = tokio::time::timeout(WAIT, client.wait_for_instances())
        .await
        .expect("instance in time")
        .expect("instances");
    assert_eq!(ids, vec![b.connection_id()]);
    let body = Bytes::from_static(b"\"tls\"");
    let mut stream = client
        .generate(body.clone(), Route::RoundRobin, Default::default(), None)
        .await
        .expect("request");
    assert_eq!(stream.next().await.expect("item").expect("ok"), body);

    // Without the client certificate the server refuses (it requires one); without TLS
    // files an https endpoint is a configuration error; a certificate without its key too.
    let no_client_cert = EtcdTls {
        ca: Some(pki.ca.clone()),
        ..EtcdTls::default()
    };
    let Err(err) = connect(no_client_cert).await else {
        panic!("refused");
    };
    assert!(matches!(err, Error::Discovery(_)), "{err:?}");
    let Err(err) = connect(EtcdTls::default()).await else {
        panic!("no CA");
    };
    assert!(err.to_string().contains("ETCD_AUTH_CA"), "{err}");
    let half = EtcdTls {
        client_key: None,
        ..full.clone()
    };
    let Err(err) = connect(half).await else {
        panic!("cert without key");
    };
    assert!(err.to_string().contains("ETCD_AUTH_CLIENT_KEY"), "{err}");
    let missing = EtcdTls {
        ca: Some(etcd.dir().join("nope.pem")),
        ..full
    };
    let Err(err) = connect(missing).await else {
        panic!("missing CA file");
    };
    assert!(err.to_string().contains("nope.pem"), "{err}");

    b.shutdown();
    tokio::time::timeout(WAIT, serving)
        .await
        .expect("serve ends")
        .expect("task")
        .expect("served");
    a.shutdown();
    tokio::time::timeout(WAIT, a.stopped())
        .await
        .expect("stopped");
}
