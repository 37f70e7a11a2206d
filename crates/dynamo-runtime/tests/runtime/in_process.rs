//! A caller reaching a listener of its own process: in process (the default) it sees the
//! same items, stops, rejections and connection end as through loopback TCP.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dynamo_runtime::config::{DiscoveryBackend, RequestPlane};
use dynamo_runtime::discovery::{Instance, TransportAddress};
use dynamo_runtime::transport::client::{Connection, ConnectionPool, ResponseStream};
use dynamo_runtime::transport::server::{Handler, Request, Responder};
use dynamo_runtime::{Context, DistributedRuntime, EndpointId, Error, Route, RuntimeConfig};

/// Replies with the request body twice, then ends.
struct Twice;

impl Handler for Twice {
    fn start(&self, request: Request, mut out: Responder) {
        let _ = out.send(&request.body);
        let _ = out.send(&request.body);
        out.finish();
    }
}

/// Streams until stopped, then reports the request id and whether it was killed.
struct UntilStopped(tokio::sync::mpsc::UnboundedSender<(String, bool)>);

impl Handler for UntilStopped {
    fn start(&self, request: Request, mut out: Responder) {
        let report = self.0.clone();
        tokio::spawn(async move {
            out.accept();
            loop {
                if request.context.is_stopped() {
                    let ctx = &request.context;
                    let _ = report.send((ctx.id().to_owned(), ctx.is_killed()));
                    out.finish();
                    return;
                }
                let _ = out.send(b"1");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
    }
}

fn runtime(in_process: bool) -> DistributedRuntime {
    let config = RuntimeConfig {
        tcp_in_process: in_process,
        max_message_size: 4096,
        ..RuntimeConfig::default()
    };
    DistributedRuntime::new(DiscoveryBackend::Mem, RequestPlane::Tcp, config).expect("runtime")
}

fn unique(name: &str) -> EndpointId {
    EndpointId::parse(&format!("ip{:x}.{name}.generate", fastrand::u64(..))).expect("valid name")
}

/// An error without the parts that differ between runs (addresses, endpoint names).
fn describe(e: &Error) -> String {
    match e {
        Error::Remote(w) => format!(
            "Remote({:?}): {}",
            w.kind,
            w.message.split(':').next().unwrap_or("")
        ),
        other => format!("{other:?}")
            .split('(')
            .next()
            .unwrap_or("")
            .to_owned(),
    }
}

/// How a stream ended, after any number of items.
async fn ending(s: &mut ResponseStream) -> String {
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match s.next().await {
                Some(Ok(_)) => {}
                Some(Err(e)) => return describe(&e),
                None => return "end".to_owned(),
            }
        }
    })
    .await;
    end.unwrap_or_else(|_| "timed out".to_owned())
}

async fn open(conn: &Arc<Connection>, path: &str, body: &[u8]) -> Result<ResponseStream, Error> {
    ResponseStream::open(
        Arc::clone(conn),
        path,
        body,
        Context::default(),
        None,
        Duration::from_secs(5),
    )
    .await
}

async fn call(
    drt: &DistributedRuntime,
    ep: &EndpointId,
    body: &'static [u8],
    ctx: Context,
) -> Result<ResponseStream, Error> {
    let client = drt.client(ep);
    client.wait_for_instances().await?;
    client
        .generate(Bytes::from_static(body), Route::RoundRobin, ctx, None)
        .await
}

/// The same calls from one runtime to another of the same process; what the caller saw.
#[expect(
    clippy::unwrap_used,
    reason = "a test script: any unexpected failure fails the test"
)]
async fn script(in_process: bool) -> Vec<String> {
    let (worker, caller) = (runtime(in_process), runtime(in_process));
    let (twice, until, missing) = (unique("twice"), unique("until"), unique("missing"));
    let (tx, mut reported) = tokio::sync::mpsc::unbounded_channel();
    for (ep, handler) in [
        (twice.clone(), Arc::new(Twice) as Arc<dyn Handler>),
        (until.clone(), Arc::new(UntilStopped(tx))),
    ] {
        let worker = worker.clone();
        tokio::spawn(async move { worker.serve_endpoint(&ep, handler, false).await });
    }
    let mut seen = Vec::new();

    // The connection is in process exactly when asked for.
    let client = caller.client(&twice);
    client.wait_for_instances().await.unwrap();
    let TransportAddress::Tcp(addr) = client.instances()[0].transport.clone() else {
        panic!("tcp expected")
    };
    let (host, path) = addr.split_once('/').unwrap();
    let pool = ConnectionPool::new(4096, Duration::from_secs(5)).in_process(in_process);
    assert_eq!(pool.get(host).await.unwrap().is_in_process(), in_process);

    // Items, in order, then the end.
    let mut s = call(&caller, &twice, b"\"x\"", Context::default())
        .await
        .unwrap();
    while let Some(item) = s.next().await {
        seen.push(String::from_utf8(item.unwrap().to_vec()).unwrap());
    }

    // A request over the worker's limit, sent by a caller with a larger one: rejected, and
    // the connection carries on.
    let big = ConnectionPool::new(1 << 20, Duration::from_secs(5)).in_process(in_process);
    let conn = big.get(host).await.unwrap();
    let err = open(&conn, path, &[b'1'; 5000]).await.err();
    seen.push(err.as_ref().map(describe).unwrap_or_default());
    let mut s = open(&conn, path, b"\"y\"").await.unwrap();
    seen.push(ending(&mut s).await);

    // An endpoint the worker does not serve.
    let fake = Instance::new(
        &missing,
        77,
        TransportAddress::Tcp(format!("{host}/{}", missing.path())),
    );
    caller.discovery().register(&fake).await.unwrap();
    let err = call(&caller, &missing, b"1", Context::default())
        .await
        .err();
    seen.push(err.as_ref().map(describe).unwrap_or_default());

    // A stop and a drop reach the handler (a stop as a stop, not a kill).
    let parent = Context::new(Some("stop-me".into()), Default::default());
    let mut s = call(&caller, &until, b"1", parent.child()).await.unwrap();
    assert!(s.next().await.is_some());
    parent.stop_generating();
    seen.push(format!("{:?}", reported.recv().await));
    seen.push(ending(&mut s).await);
    let ctx = Context::new(Some("drop-me".into()), Default::default());
    let mut s = call(&caller, &until, b"1", ctx).await.unwrap();
    assert!(s.next().await.is_some());
    drop(s);
    seen.push(format!("{:?}", reported.recv().await));

    // The worker's runtime shuts down under a stream in flight: its handler is killed,
    // the stream ends, and the next call finds nobody listening.
    let ctx = Context::new(Some("shut-down".into()), Default::default());
    let mut s = call(&caller, &until, b"1", ctx).await.unwrap();
    assert!(s.next().await.is_some());
    worker.shutdown();
    seen.push(format!("{:?}", reported.recv().await));
    seen.push(ending(&mut s).await);
    worker.stopped().await;
    let after = open(&conn, path, b"1").await.err();
    seen.push(after.as_ref().map(describe).unwrap_or_default());

    caller.discovery().unregister(&fake).await.unwrap();
    caller.shutdown();
    caller.stopped().await;
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_process_caller_sees_what_a_loopback_caller_sees() {
    let local = script(true).await;
    let tcp = script(false).await;
    assert_eq!(local, tcp);
    assert_eq!(&local[..2], ["\"x\"", "\"x\""]);
    assert!(local[2].contains("Request too large"), "{}", local[2]);
    assert_eq!(local[3], "end");
    assert!(local[4].contains("Unknown endpoint"), "{}", local[4]);
    assert_eq!(local[5], r#"Some(("stop-me", false))"#);
    assert_eq!(local[6], "end");
    assert_eq!(local[7], r#"Some(("drop-me", false))"#);
    assert_eq!(local[8], r#"Some(("shut-down", true))"#);
    assert_eq!(local[9], "end");
    assert_eq!(local[10], "Disconnected");
}
