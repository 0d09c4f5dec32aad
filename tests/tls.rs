//! `rediss://` against a local redis-server with a self-signed certificate
//! made for the test. Needs the `tls` feature and the `openssl` command.
#![cfg(feature = "tls")]

mod support;

use std::io::Write;
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

/// Makes, in `dir` (where [`make_certificates`] made the CA), a client
/// certificate signed by that CA, and one signed by a CA the server does
/// not know. Returns (certificate, key) of each.
fn make_client_certificates(dir: &Path) -> ((String, String), (String, String)) {
    std::fs::write(
        dir.join("client.cnf"),
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    let sign = |name: &str, ca: &str| {
        let (key, csr, cert) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        openssl(
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &key,
                "-out",
                &csr,
            ],
            dir,
        );
        openssl(
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &format!("{ca}.pem"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-days",
                "1",
                "-extfile",
                "client.cnf",
                "-out",
                &cert,
            ],
            dir,
        );
        let path = |name: &str| dir.join(name).display().to_string();
        (path(&cert), path(&key))
    };
    // A second CA, unknown to the server.
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
            "/CN=redbaton-test-stranger-ca",
            "-keyout",
            "stranger-ca.key",
            "-out",
            "stranger-ca.pem",
        ],
        dir,
    );
    (sign("client", "ca"), sign("stranger", "stranger-ca"))
}

/// A TLS-only server on a free port with the certificates of `dir`; `None`
/// (the test then says it is skipped) when the server binary has no TLS.
fn start_tls_server(
    dir: &Path,
    ca: &str,
    cert: &str,
    key: &str,
    auth_clients: bool,
) -> Option<(RedisServer, String)> {
    let tls_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let _ = dir;
    let auth = if auth_clients { "yes" } else { "no" };
    let started = RedisServer::try_start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        cert,
        "--tls-key-file",
        key,
        "--tls-ca-cert-file",
        ca,
        "--tls-auth-clients",
        auth,
    ]);
    match started {
        Ok(server) => Some((server, format!("rediss://127.0.0.1:{tls_port}/"))),
        // A server built without TLS (Valkey's embedded build, say) cannot
        // take part: the test is skipped, and says so where CI shows it.
        Err(reason) if reason.contains("TLS support") => {
            let _ = writeln!(
                std::io::stderr(),
                "skipped: {} was built without TLS support",
                testkit::server_binary()
            );
            None
        }
        Err(reason) => panic!("{reason}"),
    }
}

#[test]
fn locks_work_over_tls_with_a_trusted_self_signed_certificate() {
    let dir = std::env::temp_dir().join(format!("redbaton-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, cert, key) = make_certificates(&dir);
    let Some((server, url)) = start_tls_server(&dir, &ca, &cert, &key, false) else {
        return;
    };
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
    // The counter sets aside `max_local_handoffs` (64) tokens above it.
    assert_eq!(fence, second + 64);

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

#[test]
fn a_server_that_authenticates_clients_accepts_a_client_certificate_and_refuses_the_rest() {
    let dir = std::env::temp_dir().join(format!("redbaton-mtls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, cert, key) = make_certificates(&dir);
    let ((client_cert, client_key), (stranger_cert, stranger_key)) = make_client_certificates(&dir);
    let Some((_server, url)) = start_tls_server(&dir, &ca, &cert, &key, true) else {
        return;
    };
    let root = std::fs::read(&ca).unwrap();
    let read = |path: &str| std::fs::read(path).unwrap();

    // With a certificate the server's CA signed: locks work, and waiting
    // (a parked connection, which presents it too) works.
    let client = Client::builder(&url)
        .tls_root_certificate(&root)
        .tls_client_certificate(&read(&client_cert), &read(&client_key))
        .io_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let lock = client.lock("mtls").unwrap();
    let held = lock.lock().unwrap();
    let waiter = lock.clone();
    let waited = thread::spawn(move || {
        waiter
            .try_lock_for(Duration::from_secs(10))
            .unwrap()
            .map(|g| g.fencing_token())
    });
    let first = held.fencing_token();
    held.unlock().unwrap();
    assert!(waited.joined().expect("acquired over mTLS") > first);

    // The order of the TLS settings does not matter: each keeps the other.
    let reversed = Client::builder(&url)
        .tls_client_certificate(&read(&client_cert), &read(&client_key))
        .tls_root_certificate(&root)
        .io_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    assert!(reversed.lock("mtls").unwrap().try_lock().unwrap().is_some());

    // Without a certificate, or with one of a CA the server does not
    // trust: refused in the handshake, a clear Unreachable error.
    let without = Client::builder(&url)
        .tls_root_certificate(&root)
        .io_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let stranger = Client::builder(&url)
        .tls_root_certificate(&root)
        .tls_client_certificate(&read(&stranger_cert), &read(&stranger_key))
        .io_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    for (who, client) in [("no certificate", without), ("unknown CA", stranger)] {
        let err = client.lock("mtls").unwrap().try_lock().unwrap_err();
        assert!(err.is_unreachable(), "{who}: {err}");
        assert!(
            err.to_string().contains("client certificate"),
            "{who}: {err}"
        );
        println!("{who}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
