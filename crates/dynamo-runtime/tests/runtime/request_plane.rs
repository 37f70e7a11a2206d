//! Request-plane behaviour through the public API: routing, size limits, connection loss,
//! cancellation and graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dynamo_runtime::config::{DiscoveryBackend, RequestPlane};
use dynamo_runtime::discovery::{Instance, TransportAddress};
use dynamo_runtime::transport::frame;
use dynamo_runtime::transport::server::{Handler, Request, Responder};
use dynamo_runtime::{Context, DistributedRuntime, EndpointId, Error, Route, RuntimeConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Replies with its tag, then the request body, then ends.
struct Tagged(&'static str);

impl Handler for Tagged {
    fn start(&self, request: Request, mut out: Responder) {
        let _ = out.send(format!("\"{}\"", self.0).as_bytes());
        let _ = out.send(&request.body);
        out.finish();
    }
}

/// Streams until stopped, then reports the stop.
struct UntilStopped(tokio::sync::mpsc::UnboundedSender<String>);

impl Handler for UntilStopped {
    fn start(&self, request: Request, mut out: Responder) {
        let report = self.0.clone();
        tokio::spawn(async move {
            out.accept();
            loop {
                if request.context.is_stopped() {
                    let _ = report.send(request.context.id().to_owned());
                    out.finish();
                    return;
                }
                let _ = out.send(b"1");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
}

fn runtime(config: RuntimeConfig) -> DistributedRuntime {
    DistributedRuntime::new(DiscoveryBackend::Mem, RequestPlane::Tcp, config).expect("runtime")
}

fn unique(name: &str) -> EndpointId {
    EndpointId::parse(&format!("rp{:x}.{name}.generate", fastrand::u64(..))).expect("valid name")
}

async fn items(stream: &mut dynamo_runtime::transport::client::ResponseStream) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(item) = stream.next().await {
        let item = item.expect("item");
        out.push(String::from_utf8(item.to_vec()).expect("utf-8"));
    }
    out
}

fn serve(drt: &DistributedRuntime, ep: &EndpointId, handler: Arc<dyn Handler>) {
    let drt = drt.clone();
    let ep = ep.clone();
    tokio::spawn(async move { drt.serve_endpoint(&ep, handler, true).await });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_alternates_and_direct_targets_one_instance() {
    let ep = unique("rr");
    let (a, b) = (
        runtime(RuntimeConfig::default()),
        runtime(RuntimeConfig::default()),
    );
    serve(&a, &ep, Arc::new(Tagged("a")));
    serve(&b, &ep, Arc::new(Tagged("b")));
    let client = a.client(&ep);
    tokio::time::timeout(Duration::from_secs(5), async {
        while client.instance_ids().len() < 2 {
            client.wait_for_instances().await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    let mut tags = Vec::new();
    for _ in 0..6 {
        let mut s = client
            .generate(
                Bytes::from_static(b"1"),
                Route::RoundRobin,
                Context::default(),
                None,
            )
            .await
            .unwrap();
        let got = items(&mut s).await;
        assert_eq!(got[1], "1");
        tags.push(got[0].clone());
    }
    assert!(tags.windows(2).all(|w| w[0] != w[1]), "{tags:?}");
    let mut s = client
        .generate(
            Bytes::from_static(b"2"),
            Route::Direct(b.connection_id()),
            Context::default(),
            None,
        )
        .await
        .unwrap();
    assert_eq!(items(&mut s).await, ["\"b\"", "2"]);
    let missing = client
        .generate(
            Bytes::from_static(b"2"),
            Route::Direct(7),
            Context::default(),
            None,
        )
        .await;
    assert!(matches!(missing, Err(Error::UnknownInstance { .. })));
    a.shutdown();
    b.shutdown();
    a.stopped().await;
    b.stopped().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_request_is_rejected_and_the_connection_survives() {
    let config = RuntimeConfig {
        max_message_size: 1024,
        ..RuntimeConfig::default()
    };
    let drt = runtime(config);
    let ep = unique("big");
    serve(&drt, &ep, Arc::new(Tagged("x")));
    let client = drt.client(&ep);
    client.wait_for_instances().await.unwrap();
    // The client refuses to send it.
    let err = client
        .generate(
            Bytes::from(vec![b'1'; 2000]),
            Route::Random,
            Context::default(),
            None,
        )
        .await
        .err()
        .unwrap();
    assert!(matches!(
        err,
        Error::MessageTooLarge {
            size: 2000,
            max: 1024
        }
    ));
    // A raw caller that sends it anyway gets an error frame; the connection carries on.
    let TransportAddress::Tcp(addr) = client.instances()[0].transport.clone() else {
        panic!("tcp expected")
    };
    let (host, path) = addr.split_once('/').unwrap();
    let mut sock = TcpStream::connect(host).await.unwrap();
    let prefix = frame::request_prefix(path, br#"{"id":"big"}"#);
    sock.write_all(&frame::encode(frame::REQUEST, 1, &[&prefix, &[b'1'; 2000]]))
        .await
        .unwrap();
    sock.write_all(&frame::encode(frame::REQUEST, 2, &[&prefix, b"3"]))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.last().map(|(k, _): &(u8, u64)| *k) != Some(frame::END) {
        let frame::Read::Frame(f) = frame::read_frame(&mut sock, usize::MAX).await.unwrap() else {
            panic!("connection closed")
        };
        seen.push((f.kind, f.stream));
    }
    assert_eq!(seen[0], (frame::ERROR, 1));
    assert_eq!(
        &seen[1..],
        [
            (frame::ACK, 2),
            (frame::DATA, 2),
            (frame::DATA, 2),
            (frame::END, 2)
        ]
    );
    drt.shutdown();
    drt.stopped().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_ends_the_stream_with_disconnected() {
    // A fake worker: acknowledges, sends one item, then drops the connection.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let frame::Read::Frame(f) = frame::read_frame(&mut sock, usize::MAX).await.unwrap() else {
            return;
        };
        sock.write_all(&frame::encode(frame::ACK, f.stream, &[]))
            .await
            .unwrap();
        sock.write_all(&frame::encode(frame::DATA, f.stream, &[b"7"]))
            .await
            .unwrap();
        let mut buf = [0u8; 16];
        let _ = tokio::time::timeout(Duration::from_millis(50), sock.read(&mut buf)).await;
    });
    let drt = runtime(RuntimeConfig::default());
    let ep = unique("dead");
    let fake = Instance::new(
        &ep,
        99,
        TransportAddress::Tcp(format!("{addr}/{}", ep.path())),
    );
    drt.discovery().register(&fake).await.unwrap();
    let client = drt.client(&ep);
    client.wait_for_instances().await.unwrap();
    let mut s = client
        .generate(
            Bytes::from_static(b"1"),
            Route::RoundRobin,
            Context::default(),
            None,
        )
        .await
        .unwrap();
    assert_eq!(&s.next().await.unwrap().unwrap()[..], b"7");
    let end = tokio::time::timeout(Duration::from_secs(2), s.next())
        .await
        .unwrap();
    assert!(matches!(end, Some(Err(Error::Disconnected(_)))), "{end:?}");
    assert!(s.next().await.is_none());
    drt.discovery().unregister(&fake).await.unwrap();
    drt.shutdown();
    drt.stopped().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_and_drop_reach_the_handler() {
    let drt = runtime(RuntimeConfig::default());
    let ep = unique("stop");
    let (tx, mut stopped) = tokio::sync::mpsc::unbounded_channel();
    serve(&drt, &ep, Arc::new(UntilStopped(tx)));
    let client = drt.client(&ep);
    client.wait_for_instances().await.unwrap();

    let caller = Context::new(Some("stop-me".into()), Default::default());
    let mut s = client
        .generate(
            Bytes::from_static(b"1"),
            Route::RoundRobin,
            caller.child(),
            None,
        )
        .await
        .unwrap();
    assert!(s.next().await.is_some());
    caller.stop_generating();
    let id = tokio::time::timeout(Duration::from_secs(1), stopped.recv())
        .await
        .unwrap();
    assert_eq!(id.as_deref(), Some("stop-me"));
    // The stream ends cleanly after the stop.
    tokio::time::timeout(Duration::from_secs(1), async {
        while s.next().await.is_some() {}
    })
    .await
    .unwrap();

    let mut s = client
        .generate(
            Bytes::from_static(b"1"),
            Route::RoundRobin,
            Context::new(Some("drop-me".into()), Default::default()),
            None,
        )
        .await
        .unwrap();
    assert!(s.next().await.is_some());
    drop(s);
    let id = tokio::time::timeout(Duration::from_secs(1), stopped.recv())
        .await
        .unwrap();
    assert_eq!(id.as_deref(), Some("drop-me"));
    drt.shutdown();
    drt.stopped().await;
}

/// Reports whether the request's context was stopped when the handler started.
struct StoppedAtStart(tokio::sync::mpsc::UnboundedSender<bool>);

impl Handler for StoppedAtStart {
    fn start(&self, request: Request, out: Responder) {
        let _ = self.0.send(request.context.is_stopped());
        out.finish();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_sent_with_a_stopped_context_starts_stopped() {
    let ep = unique("prestopped");
    let drt = runtime(RuntimeConfig::default());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    serve(&drt, &ep, Arc::new(StoppedAtStart(tx)));
    let client = drt.client(&ep);
    client.wait_for_instances().await.unwrap();
    for stopped in [false, true] {
        let ctx = Context::default();
        if stopped {
            ctx.stop_generating();
        }
        let mut s = client
            .generate(Bytes::from_static(b"\xc0"), Route::RoundRobin, ctx, None)
            .await
            .unwrap();
        assert!(items(&mut s).await.is_empty());
        // The handler is called either way and sees the caller's state from the start.
        assert_eq!(rx.recv().await, Some(stopped));
    }
}
