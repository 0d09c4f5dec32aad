//! [`FaultProxy`]: a TCP proxy on loopback between a client and one
//! server, that stages what networks do to replies: a reply lost after the
//! command ran (the connection reset on its way back), requests held up,
//! every connection reset at once, a silent peer.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// A proxy in front of `127.0.0.1:<upstream>`; stops accepting when
/// dropped (connections already open are reset).
///
/// ```no_run
/// let server = testkit::RedisServer::start();
/// let proxy = testkit::FaultProxy::start(server.port());
/// // A client of `proxy.url()`; then: the next request that names
/// // EVALSHA runs on the server, and its reply never comes back.
/// proxy.drop_reply_to(b"EVALSHA");
/// ```
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    stopped: AtomicBool,
    /// The next request containing these bytes loses its reply.
    drop_reply_to: Mutex<Option<Vec<u8>>>,
    /// Replies dropped so far.
    dropped: AtomicU64,
    /// The next request containing these bytes has its reply held this
    /// long.
    hold_reply_to: Mutex<Option<(Vec<u8>, Duration)>>,
    /// Held before each request chunk is passed on, in microseconds.
    delay_micros: AtomicU64,
    /// Requests are read and never passed on (a peer that went silent).
    silent: AtomicBool,
    /// Every connection opened so far, to reset them all at once.
    open: Mutex<Vec<TcpStream>>,
    accepted: AtomicU64,
}

impl FaultProxy {
    /// Starts forwarding a free loopback port to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> FaultProxy {
        let listener =
            TcpListener::bind("127.0.0.1:0").expect("bind a loopback port for the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let shared = Arc::new(Shared::default());
        let accepting = Arc::clone(&shared);
        thread::spawn(move || {
            for inbound in listener.incoming() {
                if accepting.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(inbound) = inbound else { continue };
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    reset(&inbound);
                    continue;
                };
                accepting.accepted.fetch_add(1, Ordering::SeqCst);
                connect_pair(&accepting, inbound, outbound);
            }
        });
        FaultProxy { addr, shared }
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// Arms the proxy: the next request whose bytes contain `pattern` is
    /// passed on and runs, then its reply is thrown away and the client's
    /// connection reset: the client cannot tell whether it ran.
    pub fn drop_reply_to(&self, pattern: &[u8]) {
        *self.shared.drop_reply_to.lock().unwrap() = Some(pattern.to_vec());
    }

    /// Arms the proxy: the next request whose bytes contain `pattern` is
    /// passed on and runs at once, and its reply reaches the client
    /// `delay` later (a slow network on the way back): what happens on the
    /// server meanwhile comes before the client hears its command ran.
    pub fn hold_reply_to(&self, pattern: &[u8], delay: Duration) {
        *self.shared.hold_reply_to.lock().unwrap() = Some((pattern.to_vec(), delay));
    }

    /// Whether an armed [`drop_reply_to`](FaultProxy::drop_reply_to) is
    /// still waiting for its request.
    pub fn is_armed(&self) -> bool {
        self.shared.drop_reply_to.lock().unwrap().is_some()
    }

    /// How many replies were thrown away so far.
    pub fn dropped_replies(&self) -> u64 {
        self.shared.dropped.load(Ordering::SeqCst)
    }

    /// Holds every request chunk for `delay` before passing it on
    /// (`Duration::ZERO`: none).
    pub fn set_delay(&self, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.delay_micros.store(micros, Ordering::SeqCst);
    }

    /// While `true`, requests are read and never passed on: the server
    /// seems stopped to clients of this proxy, though it accepts
    /// connections.
    pub fn set_silent(&self, silent: bool) {
        self.shared.silent.store(silent, Ordering::SeqCst);
    }

    /// Resets every connection open through the proxy now.
    pub fn reset_all(&self) {
        for conn in self.shared.open.lock().unwrap().drain(..) {
            reset(&conn);
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.reset_all();
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
    }
}

/// Two threads for one client connection: requests up, replies down.
fn connect_pair(shared: &Arc<Shared>, inbound: TcpStream, outbound: TcpStream) {
    let (Ok(client_side), Ok(server_side)) = (inbound.try_clone(), outbound.try_clone()) else {
        return;
    };
    {
        let mut open = shared.open.lock().unwrap();
        if let (Ok(a), Ok(b)) = (inbound.try_clone(), outbound.try_clone()) {
            open.push(a);
            open.push(b);
        }
    }
    // Set by the request side when the reply to what it just passed on
    // must be thrown away.
    let lose_next_reply = Arc::new(AtomicBool::new(false));
    let losing = Arc::clone(&lose_next_reply);
    // Set by the request side when the reply to what it just passed on
    // must be held (microseconds).
    let hold_next_reply = Arc::new(AtomicU64::new(0));
    let holding = Arc::clone(&hold_next_reply);
    let replies_shared = Arc::clone(shared);
    thread::spawn(move || {
        let (mut from_server, mut to_client) = (outbound, client_side);
        let mut buf = [0; 16 * 1024];
        while let Ok(n @ 1..) = from_server.read(&mut buf) {
            if losing.swap(false, Ordering::SeqCst) {
                replies_shared.dropped.fetch_add(1, Ordering::SeqCst);
                break;
            }
            let hold = holding.swap(0, Ordering::SeqCst);
            if hold > 0 {
                thread::sleep(Duration::from_micros(hold)); // the fault under test
            }
            if to_client.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        reset(&to_client);
        let _ = from_server.shutdown(Shutdown::Both);
    });
    let requests_shared = Arc::clone(shared);
    thread::spawn(move || {
        let (mut from_client, mut to_server) = (inbound, server_side);
        let mut buf = [0; 16 * 1024];
        while let Ok(n @ 1..) = from_client.read(&mut buf) {
            let shared = &requests_shared;
            if shared.silent.load(Ordering::SeqCst) {
                continue;
            }
            let delay = shared.delay_micros.load(Ordering::SeqCst);
            if delay > 0 {
                thread::sleep(Duration::from_micros(delay)); // the fault under test
            }
            {
                let mut armed = shared.drop_reply_to.lock().unwrap();
                let hit = armed
                    .as_ref()
                    .is_some_and(|pattern| contains(&buf[..n], pattern));
                if hit {
                    *armed = None;
                    lose_next_reply.store(true, Ordering::SeqCst);
                }
            }
            {
                let mut armed = shared.hold_reply_to.lock().unwrap();
                let hit = armed
                    .as_ref()
                    .is_some_and(|(pattern, _)| contains(&buf[..n], pattern));
                if hit {
                    let (_, delay) = armed.take().unwrap_or_default();
                    let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
                    hold_next_reply.store(micros.max(1), Ordering::SeqCst);
                }
            }
            if to_server.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to_server.shutdown(Shutdown::Both);
    });
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// Ends `stream` now: shut down both ways (the peer reads end of file, a
/// dropped connection), with no linger, so that its last close sends a
/// reset (RST) as a NAT or a proxy that gave up does.
fn reset(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket descriptor and a correctly sized option value.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::addr_of!(linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    let _ = stream.shutdown(Shutdown::Both);
}
