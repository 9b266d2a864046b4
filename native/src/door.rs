//! `Door`: a gRPC server in native code whose calls are answered by Python.
//!
//! The RocketMQ 5 SDKs' door (`apache.rocketmq.v2`, with health and reflection beside
//! it). HTTP/2 is hyper's, gRPC's framing, compression and status trailers are tonic's,
//! TLS is rustls'; they run on tokio threads of their own and never take the GIL. What a
//! call means is decided in Python (`ferry.runtime.native_server`): every method this
//! door serves is one Python registered, by path, with its kind; the messages cross as
//! bytes, undecoded.
//!
//! What crosses between the two sides crosses in batches. The tokio side appends events
//! (a call arrived, a client-streamed message, the client's end, a cancellation, a log
//! line) to one queue and writes a byte to a socket pair only when the queue was empty;
//! Python's event loop reads that socket and takes the whole queue in one call (`take`),
//! and hands its answers back in one call per loop turn (`reply`). A client-streamed
//! message is read only when Python asks for the next (`demand`), so a client that
//! writes faster than the proxy reads is slowed by HTTP/2 flow control, not buffered.
//!
//! Bounds: at most `max_calls` calls open at once (beyond that a call is answered at once
//! with the method's overload answer, which Python gave at registration, or gRPC's
//! RESOURCE_EXHAUSTED), messages up to `max_message_bytes`, headers up to
//! `MAX_HEADER_LIST` bytes, `max_streams` streams per connection, 10 s for the first
//! byte, the TLS handshake and the HTTP/2 preface; keepalive pings notice dead peers.
//! Whatever a connection sends that is not HTTP/2 (or TLS where TLS is served) closes it,
//! with a count in `stats` and a log line through Python's logging.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use futures_util::stream::{self, Stream};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{Grpc, ServerStreamingService, StreamingService, UnaryService};
use tonic::{Request, Response, Status, Streaming};

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_HEADER_LIST: u32 = 16 * 1024;
const TLS_RECORD_HANDSHAKE: u8 = 0x16;

// Event kinds, as `take` hands them to Python.
const EV_CALL: u8 = 0;
const EV_MESSAGE: u8 = 1;
const EV_HALF_CLOSE: u8 = 2;
const EV_CANCEL: u8 = 3;
const EV_LOG: u8 = 4;
const EV_DRAINED: u8 = 5;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Unary,
    ServerStream,
    BidiStream,
}

struct Method {
    index: u32,
    kind: Kind,
    overload: Option<Bytes>,
}

enum Event {
    Call {
        id: u64,
        method: u32,
        payload: Option<Bytes>,
        metadata: Vec<(String, String)>,
        peer: Arc<str>,
        timeout_ms: i64,
    },
    Message(u64, Bytes),
    HalfClose(u64, Option<String>),
    Cancel(u64),
    Log(u8, String),
    Drained,
}

enum Out {
    Msg(Bytes),
    End(Status),
}

struct Slot {
    tx: mpsc::UnboundedSender<Out>,
    demand: Option<Arc<Semaphore>>,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    tls_connections: AtomicU64,
    plaintext_connections: AtomicU64,
    refused_connections: AtomicU64,
    calls: AtomicU64,
    overloaded: AtomicU64,
    unknown_methods: AtomicU64,
}

struct Shared {
    methods: HashMap<String, Method>,
    events: Mutex<Vec<Event>>,
    waker: UnixStream,
    calls: Mutex<HashMap<u64, Slot>>,
    next_id: AtomicU64,
    max_calls: usize,
    max_message_bytes: usize,
    counters: Counters,
    /// Python gave up waiting (the door is being dropped): events are no longer queued.
    closed: AtomicBool,
}

impl Shared {
    fn push(&self, event: Event) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        let was_empty = {
            let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
            let empty = events.is_empty();
            events.push(event);
            empty
        };
        if was_empty {
            // Non-blocking: a full socket buffer already holds a wake-up.
            let _ = (&self.waker).write(&[1]);
        }
    }

    fn log(&self, level: u8, text: String) {
        self.push(Event::Log(level, text));
    }

    fn open_calls(&self) -> usize {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Ends a call's bookkeeping when the call's future or stream is dropped: Python hears
/// of a call that ended before it answered (the client went away, its deadline passed).
struct CallGuard {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let removed = self
            .shared
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
        if removed.is_some() {
            self.shared.push(Event::Cancel(self.id));
        }
    }
}

// ---------------------------------------------------------------- bytes codec

#[derive(Clone, Copy, Default)]
struct RawCodec;

struct RawEncoder;
struct RawDecoder;

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n)))
    }
}

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

// ---------------------------------------------------------------- calls

struct CallInfo {
    peer: Arc<str>,
    metadata: Vec<(String, String)>,
    timeout_ms: i64,
}

fn call_info<T>(request: &Request<T>, peer: &Arc<str>) -> CallInfo {
    let mut metadata = Vec::new();
    let mut timeout_ms = -1;
    for entry in request.metadata().iter() {
        let tonic::metadata::KeyAndValueRef::Ascii(name, value) = entry else {
            continue; // -bin headers: nothing here reads them
        };
        let name = name.as_str();
        if name == "grpc-timeout" {
            timeout_ms = value.to_str().ok().and_then(parse_timeout).unwrap_or(-1);
            continue;
        }
        if name == "te" || name == "content-type" {
            continue;
        }
        if let Ok(text) = value.to_str() {
            metadata.push((name.to_string(), text.to_string()));
        }
    }
    CallInfo {
        peer: peer.clone(),
        metadata,
        timeout_ms,
    }
}

/// gRPC's `grpc-timeout` (up to 8 digits and a unit) in milliseconds, rounded up.
fn parse_timeout(text: &str) -> Option<i64> {
    if text.len() < 2 || text.len() > 9 {
        return None;
    }
    let (digits, unit) = text.split_at(text.len() - 1);
    let n: i64 = digits.parse().ok()?;
    let ms = match unit {
        "H" => n.checked_mul(3_600_000)?,
        "M" => n.checked_mul(60_000)?,
        "S" => n.checked_mul(1000)?,
        "m" => n,
        "u" => (n + 999) / 1000,
        "n" => (n + 999_999) / 1_000_000,
        _ => return None,
    };
    Some(ms)
}

/// A call's id, its answers, its demand semaphore (streamed requests) and its guard.
type Opened = (
    u64,
    mpsc::UnboundedReceiver<Out>,
    Option<Arc<Semaphore>>,
    CallGuard,
);

/// Registers a call; None when the door is full (the caller answers the overload).
fn open_call(shared: &Arc<Shared>, bidi: bool) -> Option<Opened> {
    let (tx, rx) = mpsc::unbounded_channel();
    let demand = bidi.then(|| Arc::new(Semaphore::new(0)));
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    {
        let mut calls = shared.calls.lock().unwrap_or_else(|p| p.into_inner());
        if calls.len() >= shared.max_calls {
            return None;
        }
        calls.insert(
            id,
            Slot {
                tx,
                demand: demand.clone(),
            },
        );
    }
    shared.counters.calls.fetch_add(1, Ordering::Relaxed);
    let guard = CallGuard {
        shared: shared.clone(),
        id,
    };
    Some((id, rx, demand, guard))
}

#[allow(clippy::result_large_err)] // tonic's Status, as tonic's own services return
fn overloaded(shared: &Shared, method: &Method) -> Result<Bytes, Status> {
    shared.counters.overloaded.fetch_add(1, Ordering::Relaxed);
    match &method.overload {
        Some(answer) => Ok(answer.clone()),
        None => Err(Status::resource_exhausted(
            "the server has too many calls open; retry later",
        )),
    }
}

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type OutStream = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;

/// The answers of a streaming call as a stream: messages until Python's end, which is
/// the trailers' status (none after an OK end).
fn answers(rx: mpsc::UnboundedReceiver<Out>, guard: CallGuard) -> OutStream {
    Box::pin(stream::unfold(Some((rx, guard)), |state| async move {
        let (mut rx, guard) = state?;
        match rx.recv().await {
            Some(Out::Msg(b)) => Some((Ok(b), Some((rx, guard)))),
            Some(Out::End(status)) if status.code() == tonic::Code::Ok => None,
            Some(Out::End(status)) => Some((Err(status), None)),
            None => Some((Err(Status::unavailable("the server is stopping")), None)),
        }
    }))
}

#[derive(Clone)]
struct Call {
    shared: Arc<Shared>,
    method: Arc<str>,
    peer: Arc<str>,
}

impl Call {
    fn method(&self) -> &Method {
        &self.shared.methods[&*self.method]
    }
}

impl UnaryService<Bytes> for Call {
    type Response = Bytes;
    type Future = BoxFut<Result<Response<Bytes>, Status>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let method = this.method();
            let Some((id, mut rx, _, guard)) = open_call(&this.shared, false) else {
                return overloaded(&this.shared, method).map(Response::new);
            };
            let info = call_info(&request, &this.peer);
            let timeout_ms = info.timeout_ms;
            this.shared.push(Event::Call {
                id,
                method: method.index,
                payload: Some(request.into_inner()),
                metadata: info.metadata,
                peer: info.peer,
                timeout_ms,
            });
            let answer = async {
                match rx.recv().await {
                    Some(Out::Msg(b)) => Ok(Response::new(b)),
                    Some(Out::End(status)) => Err(status),
                    None => Err(Status::unavailable("the server is stopping")),
                }
            };
            let result = if timeout_ms >= 0 {
                match tokio::time::timeout(Duration::from_millis(timeout_ms as u64), answer).await {
                    Ok(r) => r,
                    Err(_) => Err(Status::deadline_exceeded("deadline exceeded")),
                }
            } else {
                answer.await
            };
            drop(guard); // a call Python did not end is cancelled there
            result
        })
    }
}

impl ServerStreamingService<Bytes> for Call {
    type Response = Bytes;
    type ResponseStream = OutStream;
    type Future = BoxFut<Result<Response<OutStream>, Status>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let method = this.method();
            let Some((id, rx, _, guard)) = open_call(&this.shared, false) else {
                let one = overloaded(&this.shared, method)?;
                return Ok(Response::new(
                    Box::pin(stream::once(async move { Ok(one) })) as OutStream,
                ));
            };
            let info = call_info(&request, &this.peer);
            this.shared.push(Event::Call {
                id,
                method: method.index,
                payload: Some(request.into_inner()),
                metadata: info.metadata,
                peer: info.peer,
                timeout_ms: info.timeout_ms,
            });
            Ok(Response::new(answers(rx, guard)))
        })
    }
}

impl StreamingService<Bytes> for Call {
    type Response = Bytes;
    type ResponseStream = OutStream;
    type Future = BoxFut<Result<Response<OutStream>, Status>>;

    fn call(&mut self, request: Request<Streaming<Bytes>>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let method = this.method();
            let Some((id, rx, demand, guard)) = open_call(&this.shared, true) else {
                let one = overloaded(&this.shared, method)?;
                return Ok(Response::new(
                    Box::pin(stream::once(async move { Ok(one) })) as OutStream,
                ));
            };
            let info = call_info(&request, &this.peer);
            this.shared.push(Event::Call {
                id,
                method: method.index,
                payload: None,
                metadata: info.metadata,
                peer: info.peer,
                timeout_ms: info.timeout_ms,
            });
            let mut inbound = request.into_inner();
            let demand = demand.expect("a streaming call has a demand semaphore");
            let shared = this.shared.clone();
            // Reads the client's messages one demand at a time; ends with the call.
            let reader = tokio::spawn(async move {
                loop {
                    match demand.acquire().await {
                        Ok(permit) => permit.forget(),
                        Err(_) => return,
                    }
                    match inbound.message().await {
                        Ok(Some(message)) => shared.push(Event::Message(id, message)),
                        Ok(None) => {
                            shared.push(Event::HalfClose(id, None));
                            return;
                        }
                        Err(status) => {
                            shared.push(Event::HalfClose(id, Some(status.message().to_string())));
                            return;
                        }
                    }
                }
            });
            let out = answers(rx, guard);
            let abort = reader.abort_handle();
            // The reader stops when the answers do (dropped or ended).
            let out = OnDrop {
                inner: out,
                on_drop: Some(Box::new(move || abort.abort())),
            };
            Ok(Response::new(Box::pin(out) as OutStream))
        })
    }
}

struct OnDrop<S> {
    inner: S,
    on_drop: Option<Box<dyn FnOnce() + Send>>,
}

impl<S: Stream + Unpin> Stream for OnDrop<S> {
    type Item = S::Item;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

impl<S> Drop for OnDrop<S> {
    fn drop(&mut self) {
        if let Some(f) = self.on_drop.take() {
            f();
        }
    }
}

async fn route(
    shared: Arc<Shared>,
    peer: Arc<str>,
    request: http::Request<Incoming>,
) -> http::Response<tonic::body::BoxBody> {
    let path = request.uri().path();
    let Some((key, method)) = shared.methods.get_key_value(path) else {
        shared
            .counters
            .unknown_methods
            .fetch_add(1, Ordering::Relaxed);
        let text = format!("unknown method {path}");
        return Status::unimplemented(text).into_http();
    };
    let kind = method.kind;
    let call = Call {
        method: Arc::from(key.as_str()),
        shared: shared.clone(),
        peer,
    };
    let mut grpc = Grpc::new(RawCodec)
        .accept_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(shared.max_message_bytes)
        .max_encoding_message_size(shared.max_message_bytes);
    match kind {
        Kind::Unary => grpc.unary(call, request).await,
        Kind::ServerStream => grpc.server_streaming(call, request).await,
        Kind::BidiStream => grpc.streaming(call, request).await,
    }
}

// ---------------------------------------------------------------- connections

/// A stream that first replays bytes already read from it (the HTTP/2 preface).
struct Replay<T> {
    head: Bytes,
    io: T,
}

impl<T: AsyncRead + Unpin> AsyncRead for Replay<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.head.is_empty() {
            let n = self.head.len().min(buf.remaining());
            let head = self.head.split_to(n);
            buf.put_slice(&head);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Replay<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// What hyper writes to a connection, held until it flushes, and a flush that waits
/// one turn of the scheduler before it writes.
///
/// Python answers calls in batches: one `reply` wakes the task of every call it
/// answers. Each of those tasks hands its response to the connection's task, and tokio
/// runs a task woken by a running one next (its LIFO slot), so without this each
/// answer of a batch would be written by a system call of its own, and a client would
/// read one TCP segment per answer. Here the first flush with bytes waiting wakes the
/// connection's task and returns Pending: a task that wakes itself goes to the back of
/// the run queue, behind the other answers of the batch, and the next flush writes
/// them all at once. A write larger than `COALESCE_MAX` goes straight to the socket.
struct Coalesce<T> {
    io: T,
    buf: Vec<u8>,
    written: usize,
    yielded: bool,
}

const COALESCE_MAX: usize = 64 * 1024;

impl<T> Coalesce<T> {
    fn new(io: T) -> Self {
        Coalesce {
            io,
            buf: Vec::new(),
            written: 0,
            yielded: false,
        }
    }
}

impl<T: AsyncWrite + Unpin> Coalesce<T> {
    /// Writes what is held; Ready once all of it is in the socket.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.buf.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesce<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesce<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.buf.len() + data.len() > COALESCE_MAX {
            ready!(this.poll_drain(cx))?;
            if data.len() >= COALESCE_MAX {
                return Pin::new(&mut this.io).poll_write(cx, data);
            }
        }
        this.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if this.buf.len() + total > COALESCE_MAX {
            ready!(this.poll_drain(cx))?;
            if total >= COALESCE_MAX {
                return Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
            }
        }
        for b in bufs {
            this.buf.extend_from_slice(b);
        }
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.buf.len() > this.written && !this.yielded {
            this.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        ready!(this.poll_drain(cx))?;
        this.yielded = false;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum TlsMode {
    Disabled,
    Permissive,
    Enforcing,
}

struct Config {
    tls: Option<tokio_rustls::TlsAcceptor>,
    mode: TlsMode,
    max_streams: u32,
}

fn format_peer(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => format!("ipv4:{}:{}", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("ipv6:[{}]:{}", a.ip(), a.port()),
    }
}

async fn read_preface<T: AsyncRead + Unpin>(io: &mut T) -> Result<Bytes, String> {
    let mut head = [0u8; 24];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, io.read_exact(&mut head)).await {
        Err(_) => Err("no HTTP/2 preface within 10 s".to_string()),
        Ok(Err(e)) => Err(format!("closed before the HTTP/2 preface ({e})")),
        Ok(Ok(_)) if &head != PREFACE => Err("not HTTP/2 (a gRPC client speaks HTTP/2)".into()),
        Ok(Ok(_)) => Ok(Bytes::copy_from_slice(&head)),
    }
}

async fn serve<T>(
    io: T,
    shared: Arc<Shared>,
    config: &Config,
    peer: Arc<str>,
    mut stop: watch::Receiver<bool>,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(config.max_streams)
        .max_header_list_size(MAX_HEADER_LIST)
        .keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .max_pending_accept_reset_streams(Some(64))
        .max_local_error_reset_streams(Some(256));
    let svc_shared = shared.clone();
    let svc_peer = peer.clone();
    let service = hyper::service::service_fn(move |request| {
        let shared = svc_shared.clone();
        let peer = svc_peer.clone();
        async move { Ok::<_, Infallible>(route(shared, peer, request).await) }
    });
    let connection = builder.serve_connection(TokioIo::new(Coalesce::new(io)), service);
    tokio::pin!(connection);
    let result = tokio::select! {
        r = connection.as_mut() => r,
        _ = async { let _ = stop.wait_for(|s| *s).await; } => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = result {
        // A client gone mid-call is not worth a line; a protocol error is.
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        if !text.contains("connection reset") && !text.contains("broken pipe") {
            shared.log(1, format!("gRPC connection from {peer} ended: {text}"));
        }
    }
}

async fn handle(
    mut socket: TcpStream,
    addr: SocketAddr,
    shared: Arc<Shared>,
    config: Arc<Config>,
    stop: watch::Receiver<bool>,
) {
    shared.counters.connections.fetch_add(1, Ordering::Relaxed);
    let _ = socket.set_nodelay(true);
    let peer: Arc<str> = Arc::from(format_peer(addr));
    let refuse = |why: String| {
        shared
            .counters
            .refused_connections
            .fetch_add(1, Ordering::Relaxed);
        shared.log(1, format!("closed the connection from {peer}: {why}"));
    };
    let mut first = [0u8; 1];
    let tls_first = match tokio::time::timeout(HANDSHAKE_TIMEOUT, socket.peek(&mut first)).await {
        Ok(Ok(1..)) => first[0] == TLS_RECORD_HANDSHAKE,
        Ok(Ok(_)) | Ok(Err(_)) => return, // closed at once: a port probe
        Err(_) => return refuse("sent nothing within 10 s".into()),
    };
    match (&config.tls, tls_first) {
        (Some(acceptor), true) => {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => return refuse(format!("TLS handshake failed: {e}")),
                Err(_) => return refuse("TLS handshake took over 10 s".into()),
            };
            shared
                .counters
                .tls_connections
                .fetch_add(1, Ordering::Relaxed);
            let mut tls = tls;
            let head = match read_preface(&mut tls).await {
                Ok(h) => h,
                Err(why) => return refuse(why),
            };
            serve(
                Replay { head, io: tls },
                shared.clone(),
                &config,
                peer.clone(),
                stop,
            )
            .await;
        }
        (Some(_), false) if config.mode == TlsMode::Enforcing => {
            refuse("plaintext on a TLS-only port (tlsMode enforcing)".into())
        }
        (None, true) if config.mode != TlsMode::Disabled => {
            refuse("TLS on a plaintext port".into())
        }
        _ => {
            let head = match read_preface(&mut socket).await {
                Ok(h) => h,
                Err(why) => return refuse(why),
            };
            shared
                .counters
                .plaintext_connections
                .fetch_add(1, Ordering::Relaxed);
            serve(
                Replay { head, io: socket },
                shared.clone(),
                &config,
                peer.clone(),
                stop,
            )
            .await;
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    config: Arc<Config>,
    stop: watch::Receiver<bool>,
    grace: Arc<Mutex<Duration>>,
) {
    let mut tasks = tokio::task::JoinSet::new();
    let mut stopping = stop.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, addr)) => {
                    tasks.spawn(handle(socket, addr, shared.clone(), config.clone(), stop.clone()));
                }
                Err(e) => {
                    shared.log(2, format!("accept failed: {e}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            _ = async { let _ = stopping.wait_for(|s| *s).await; } => break,
        }
    }
    drop(listener);
    let grace = *grace.lock().unwrap_or_else(|p| p.into_inner());
    let drained = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, drained).await.is_err() {
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    // Calls still open (their connections aborted) end as cancelled.
    let open: Vec<u64> = shared
        .calls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
        .map(|(id, _)| id)
        .collect();
    for id in open {
        shared.push(Event::Cancel(id));
    }
    shared.push(Event::Drained);
}

fn tls_acceptor(
    cert: &[u8],
    key: &[u8],
    client_ca: Option<&[u8]>,
) -> Result<tokio_rustls::TlsAcceptor, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<_> = rustls_pemfile::certs(&mut &cert[..])
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the certificate file is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err("the certificate file holds no certificate".into());
    }
    let key = rustls_pemfile::private_key(&mut &key[..])
        .map_err(|e| format!("the key file is not PEM: {e}"))?
        .ok_or("the key file holds no private key")?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls_pemfile::certs(&mut &ca[..]) {
                let c = c.map_err(|e| format!("the client CA file is not PEM: {e}"))?;
                roots
                    .add(c)
                    .map_err(|e| format!("a client CA certificate is unusable: {e}"))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| format!("the client CA bundle is unusable: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("the certificate and key do not make a TLS identity: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

// ---------------------------------------------------------------- Python

/// The native gRPC server (module doc). `methods`: (path, client streaming, server
/// streaming, overload answer or None) per method, indexed in the events by position.
#[pyclass(module = "ferry_native")]
pub struct Door {
    shared: Arc<Shared>,
    wake: UnixStream,
    stop: watch::Sender<bool>,
    grace: Arc<Mutex<Duration>>,
    runtime: Option<tokio::runtime::Runtime>,
    #[pyo3(get)]
    port: u16,
}

#[pymethods]
impl Door {
    #[new]
    #[pyo3(signature = (host, port, methods, max_message_bytes, max_calls, max_streams,
                        tls_mode="disabled", cert=None, key=None, client_ca=None, threads=1))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        host: &str,
        port: u16,
        methods: Vec<(String, bool, bool, Option<Vec<u8>>)>,
        max_message_bytes: usize,
        max_calls: usize,
        max_streams: u32,
        tls_mode: &str,
        cert: Option<Vec<u8>>,
        key: Option<Vec<u8>>,
        client_ca: Option<Vec<u8>>,
        threads: usize,
    ) -> PyResult<Self> {
        let mode = match tls_mode {
            "disabled" => TlsMode::Disabled,
            "permissive" => TlsMode::Permissive,
            "enforcing" => TlsMode::Enforcing,
            other => {
                return Err(PyValueError::new_err(format!(
                    "tls_mode {other:?} is not disabled, permissive or enforcing"
                )))
            }
        };
        let tls = match (cert, key, mode) {
            (_, _, TlsMode::Disabled) => None,
            (Some(c), Some(k), _) => {
                Some(tls_acceptor(&c, &k, client_ca.as_deref()).map_err(PyValueError::new_err)?)
            }
            _ => {
                return Err(PyValueError::new_err(
                    "a TLS mode other than disabled needs a certificate and a key",
                ))
            }
        };
        let mut table = HashMap::new();
        for (i, (path, client_streaming, server_streaming, overload)) in
            methods.into_iter().enumerate()
        {
            let kind = match (client_streaming, server_streaming) {
                (false, false) => Kind::Unary,
                (false, true) => Kind::ServerStream,
                (true, true) => Kind::BidiStream,
                (true, false) => {
                    return Err(PyValueError::new_err(format!(
                        "{path}: client-streaming methods are not served"
                    )))
                }
            };
            table.insert(
                path,
                Method {
                    index: i as u32,
                    kind,
                    overload: overload.map(Bytes::from),
                },
            );
        }
        let (wake, waker) = UnixStream::pair().map_err(|e| PyOSError::new_err(e.to_string()))?;
        wake.set_nonblocking(true)
            .and_then(|_| waker.set_nonblocking(true))
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        let shared = Arc::new(Shared {
            methods: table,
            events: Mutex::new(Vec::new()),
            waker,
            calls: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            max_calls: max_calls.max(1),
            max_message_bytes,
            counters: Counters::default(),
            closed: AtomicBool::new(false),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("ferry-door")
            .enable_all()
            .build()
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        let address = format!("{host}:{port}");
        let listener = py
            .detach(|| {
                runtime.block_on(async {
                    let std_listener = std::net::TcpListener::bind(&address)?;
                    std_listener.set_nonblocking(true)?;
                    TcpListener::from_std(std_listener)
                })
            })
            .map_err(|e| {
                PyOSError::new_err(format!(
                    "cannot listen on {address}: {e} (is the port in use?)"
                ))
            })?;
        let bound = listener
            .local_addr()
            .map_err(|e| PyOSError::new_err(e.to_string()))?
            .port();
        let (stop, stop_rx) = watch::channel(false);
        let grace = Arc::new(Mutex::new(Duration::from_secs(5)));
        let config = Arc::new(Config {
            tls,
            mode,
            max_streams,
        });
        runtime.spawn(accept_loop(
            listener,
            shared.clone(),
            config,
            stop_rx,
            grace.clone(),
        ));
        Ok(Door {
            shared,
            wake,
            stop,
            grace,
            runtime: Some(runtime),
            port: bound,
        })
    }

    /// The socket to watch for readability: a byte arrives when events are waiting.
    fn wake_fd(&self) -> i32 {
        self.wake.as_raw_fd()
    }

    /// Every event waiting, oldest first (and drains the wake-up socket): tuples
    /// (0, id, method index, request bytes or None, metadata pairs, peer, timeout ms or -1),
    /// (1, id, message), (2, id, error text or None), (3, id), (4, level, text), (5,).
    fn take<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut sink = [0u8; 256];
        while matches!((&self.wake).read_nonblocking(&mut sink), Ok(n) if n > 0) {}
        let events =
            std::mem::take(&mut *self.shared.events.lock().unwrap_or_else(|p| p.into_inner()));
        let out = PyList::empty(py);
        for event in events {
            let item = match event {
                Event::Call {
                    id,
                    method,
                    payload,
                    metadata,
                    peer,
                    timeout_ms,
                } => {
                    let payload = payload.map(|p| PyBytes::new(py, &p));
                    PyTuple::new(
                        py,
                        [
                            EV_CALL.into_pyobject(py)?.into_any(),
                            id.into_pyobject(py)?.into_any(),
                            method.into_pyobject(py)?.into_any(),
                            payload.into_pyobject(py)?.into_any(),
                            metadata.into_pyobject(py)?.into_any(),
                            (&*peer).into_pyobject(py)?.into_any(),
                            timeout_ms.into_pyobject(py)?.into_any(),
                        ],
                    )?
                }
                Event::Message(id, payload) => {
                    (EV_MESSAGE, id, PyBytes::new(py, &payload)).into_pyobject(py)?
                }
                Event::HalfClose(id, error) => (EV_HALF_CLOSE, id, error).into_pyobject(py)?,
                Event::Cancel(id) => (EV_CANCEL, id).into_pyobject(py)?,
                Event::Log(level, text) => (EV_LOG, level, text).into_pyobject(py)?,
                Event::Drained => (EV_DRAINED,).into_pyobject(py)?,
            };
            out.append(item)?;
        }
        Ok(out)
    }

    /// Python's answers, in order: (id, message bytes) sends a message; (id, code,
    /// details) ends the call with that gRPC status (0: OK). Answers to calls that
    /// already ended are dropped.
    fn reply(&self, answers: &Bound<'_, PyList>) -> PyResult<()> {
        let mut calls = self.shared.calls.lock().unwrap_or_else(|p| p.into_inner());
        for answer in answers.iter() {
            let answer = answer.cast::<PyTuple>()?;
            let id: u64 = answer.get_item(0)?.extract()?;
            if answer.len() == 2 {
                let item = answer.get_item(1)?;
                let bytes = item.cast::<PyBytes>()?;
                if let Some(slot) = calls.get(&id) {
                    let _ = slot
                        .tx
                        .send(Out::Msg(Bytes::copy_from_slice(bytes.as_bytes())));
                }
            } else {
                let code: i32 = answer.get_item(1)?.extract()?;
                let details: String = answer.get_item(2)?.extract()?;
                if let Some(slot) = calls.remove(&id) {
                    let status = Status::new(tonic::Code::from_i32(code), details);
                    let _ = slot.tx.send(Out::End(status));
                }
            }
        }
        Ok(())
    }

    /// Lets a streaming call's reader take the client's next message.
    fn demand(&self, id: u64) {
        let calls = self.shared.calls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Slot {
            demand: Some(d), ..
        }) = calls.get(&id)
        {
            d.add_permits(1);
        }
    }

    /// Stops accepting, asks every connection to finish its calls (HTTP/2 GOAWAY), and
    /// after `grace_s` closes what is left; event (5,) says when all is closed.
    fn shutdown(&self, grace_s: f64) {
        *self.grace.lock().unwrap_or_else(|p| p.into_inner()) =
            Duration::from_secs_f64(grace_s.clamp(0.0, 3600.0));
        let _ = self.stop.send(true);
    }

    /// Calls open now.
    fn open_calls(&self) -> usize {
        self.shared.open_calls()
    }

    /// The door's counters since it started.
    fn stats(&self) -> HashMap<&'static str, u64> {
        let c = &self.shared.counters;
        HashMap::from([
            ("connections", c.connections.load(Ordering::Relaxed)),
            ("tls_connections", c.tls_connections.load(Ordering::Relaxed)),
            (
                "plaintext_connections",
                c.plaintext_connections.load(Ordering::Relaxed),
            ),
            (
                "refused_connections",
                c.refused_connections.load(Ordering::Relaxed),
            ),
            ("calls", c.calls.load(Ordering::Relaxed)),
            ("overloaded", c.overloaded.load(Ordering::Relaxed)),
            ("unknown_methods", c.unknown_methods.load(Ordering::Relaxed)),
        ])
    }

    /// Ends the runtime at once (after `shutdown` has drained, or to give up).
    fn close(&mut self, py: Python<'_>) {
        self.shared.closed.store(true, Ordering::Relaxed);
        let _ = self.stop.send(true);
        if let Some(runtime) = self.runtime.take() {
            py.detach(|| runtime.shutdown_timeout(Duration::from_secs(1)));
        }
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

trait ReadNonBlocking {
    fn read_nonblocking(&self, buf: &mut [u8]) -> io::Result<usize>;
}

impl ReadNonBlocking for &UnixStream {
    fn read_nonblocking(&self, buf: &mut [u8]) -> io::Result<usize> {
        use std::io::Read;
        let mut s: &UnixStream = self;
        s.read(buf)
    }
}
