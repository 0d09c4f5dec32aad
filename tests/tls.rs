//! `rediss://` against a local redis-server with a self-signed certificate
//! made for the test. Needs the `tls` feature and the `openssl` command.
#![cfg(feature = "tls")]

mod support;

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use redbaton::Client;
use support::JoinWithin;
use testkit::RedisServer;

fn openssl(args: &[&str], dir: &Path) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command is needed for the TLS test (Debian: apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes, in `dir`, a self-signed CA and a server certificate for
/// 127.0.0.1 signed by it (rustls refuses a CA certificate used as the
/// server's own). Returns the paths of the CA, the server certificate and
/// its key.
fn make_certificates(dir: &Path) -> (String, String, String) {
    openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=redbaton-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
        dir,
    );
    openssl(
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "key.pem",
            "-out",
            "server.csr",
        ],
        dir,
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "ext.cnf",
            "-out",
            "cert.pem",
        ],
        dir,
    );
    let path = |name: &str| dir.join(name).display().to_string();
    (path("ca.pem"), path("cert.pem"), path("key.pem"))
}

#[test]
fn locks_work_over_tls_with_a_trusted_self_signed_certificate() {
    let dir = std::env::temp_dir().join(format!("redbaton-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, cert, key) = make_certificates(&dir);
    let tls_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-auth-clients",
        "no",
    ]);
    let url = format!("rediss://127.0.0.1:{tls_port}/");
    let pem = std::fs::read(&ca).unwrap();

    let client = Client::builder(&url)
        .tls_root_certificate(&pem)
        .build()
        .unwrap();
    let lock = client.lock("over-tls").unwrap();
    let held = lock.lock().unwrap();
    // A waiter parks over TLS too, and the baton wakes it.
    let (tx, rx) = mpsc::channel();
    let waiter = lock.clone();
    let handle = thread::spawn(move || {
        tx.send(
            waiter
                .try_lock_for(Duration::from_secs(10))
                .unwrap()
                .map(|g| g.fencing_token()),
        )
        .unwrap()
    });
    thread::sleep(Duration::from_millis(200)); // the waiter parks
    let first = held.fencing_token();
    held.unlock().unwrap();
    let second = rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("woken over TLS");
    assert!(second > first);
    handle.joined();

    // The same server over plain TCP sees the lock keys: it is one server.
    let mut raw = server.connection();
    let fence: u64 = redis::cmd("GET")
        .arg("redbaton:{over-tls}:fence")
        .query(&mut raw)
        .unwrap();
    assert_eq!(fence, second);

    // Without trusting the certificate, the handshake fails with a clear error.
    let untrusting = Client::builder(&url)
        .io_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let err = untrusting.lock("over-tls").unwrap().try_lock().unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    println!("untrusted certificate: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}
