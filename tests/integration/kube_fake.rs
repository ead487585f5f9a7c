//! Kubernetes over HTTPS for the tests, on loopback only: certificates made with the
//! openssl command, an HTTPS client (rustls, as the binary uses), a fake API server that
//! answers GET and JSON-patch PATCH of objects it holds, and RFC 6902 JSON patch.

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A CA and a server certificate for 127.0.0.1 under `dir`: (ca.pem, cert.pem, key.pem).
/// `name` tells certificates apart (a rotation makes a second one).
pub fn certificates(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let at = |f: &str| dir.join(format!("{name}-{f}"));
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let s = |p: &PathBuf| p.to_str().unwrap().to_string();
    let (ca_key, ca, key, csr, cert, ext) = (
        at("ca.key"),
        at("ca.pem"),
        at("key.pem"),
        at("req.csr"),
        at("cert.pem"),
        at("ext.cnf"),
    );
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                &s(&ca_key),
                "-out",
                &s(&ca),
                "-days",
                "2",
                "-subj",
                &format!("/CN={name}-ca"),
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                &s(&key),
                "-out",
                &s(&csr),
                "-subj",
                "/CN=localhost",
            ],
        ]
        .concat(),
    );
    openssl(&[
        "x509",
        "-req",
        "-in",
        &s(&csr),
        "-CA",
        &s(&ca),
        "-CAkey",
        &s(&ca_key),
        "-CAcreateserial",
        "-out",
        &s(&cert),
        "-days",
        "2",
        "-extfile",
        &s(&ext),
    ]);
    (ca, cert, key)
}

/// A TLS client trusting only `ca`.
pub fn client_config(ca: &Path) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

pub type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// An HTTPS connection to `addr` (127.0.0.1:PORT).
pub fn connect(addr: &str, ca: &Path) -> Tls {
    let socket = TcpStream::connect(addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(client_config(ca), name).unwrap();
    rustls::StreamOwned::new(conn, socket)
}

/// One request on an open connection: (status, body).
pub fn request(tls: &mut Tls, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).unwrap();
    tls.write_all(body).unwrap();
    tls.flush().unwrap();
    read_response(tls)
}

/// A response with Content-Length: (status, body).
pub fn read_response(stream: &mut impl Read) -> (u16, Vec<u8>) {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut length = 0;
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).unwrap();
        if h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    (status, body)
}

/// RFC 6902 `add`, `remove`, `replace` and `test`, as the API server applies a patch.
pub fn apply_patch(doc: &mut Value, patch: &[Value]) -> Result<(), String> {
    for op in patch {
        let path = op["path"].as_str().ok_or("no path")?;
        let (parent, last) = path.rsplit_once('/').ok_or("bad path")?;
        let last = last.replace("~1", "/").replace("~0", "~");
        let target = doc
            .pointer_mut(parent)
            .ok_or_else(|| format!("{parent}: not in the document"))?;
        match (op["op"].as_str(), target) {
            (Some("test"), _) => {
                if doc.pointer(path) != Some(&op["value"]) {
                    return Err(format!("test {path} failed"));
                }
            }
            (Some("add"), Value::Array(a)) if last == "-" => a.push(op["value"].clone()),
            (Some("add"), Value::Array(a)) => {
                let i: usize = last.parse().map_err(|_| "index")?;
                if i > a.len() {
                    return Err(format!("{path}: index past the end"));
                }
                a.insert(i, op["value"].clone());
            }
            (Some("add" | "replace"), Value::Object(m)) => {
                if op["op"] == "replace" && !m.contains_key(&last) {
                    return Err(format!("replace {path}: not there"));
                }
                m.insert(last, op["value"].clone());
            }
            (Some("remove"), Value::Object(m)) => {
                m.remove(&last)
                    .ok_or_else(|| format!("remove {path}: not there"))?;
            }
            (o, _) => return Err(format!("{o:?} on {path}: not supported here")),
        }
    }
    Ok(())
}

/// A request the fake API server got.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub authorization: String,
    pub content_type: String,
    pub body: String,
}

/// The fake API server: objects by path; GET answers one, PATCH applies a JSON patch
/// (a failed `test` answers 422, as the API server does) and bumps resourceVersion.
pub struct FakeApi {
    pub addr: String,
    pub objects: Arc<Mutex<BTreeMap<String, Value>>>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// A service account directory (ca.crt, token) that trusts this server.
    pub account: PathBuf,
}

impl FakeApi {
    pub fn start(dir: &Path, objects: BTreeMap<String, Value>) -> FakeApi {
        let (ca, cert, key) = certificates(dir, "api");
        let account = dir.join("serviceaccount");
        std::fs::create_dir_all(&account).unwrap();
        std::fs::copy(&ca, account.join("ca.crt")).unwrap();
        std::fs::write(account.join("token"), "test-token\n").unwrap();
        let server = server_config(&cert, &key);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (objects, seen) = (
            Arc::new(Mutex::new(objects)),
            Arc::new(Mutex::new(Vec::new())),
        );
        let (o, s) = (Arc::clone(&objects), Arc::clone(&seen));
        std::thread::spawn(move || {
            for socket in listener.incoming().flatten() {
                let conn = rustls::ServerConnection::new(Arc::clone(&server)).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, socket);
                let _ = serve_one(&mut tls, &o, &s);
            }
        });
        FakeApi {
            addr,
            objects,
            seen,
            account,
        }
    }

    /// The variables a pod has for the API server.
    pub fn env(&self) -> Vec<(String, String)> {
        let (host, port) = self.addr.split_once(':').unwrap();
        vec![
            ("KUBERNETES_SERVICE_HOST".into(), host.into()),
            ("KUBERNETES_SERVICE_PORT".into(), port.into()),
        ]
    }

    pub fn object(&self, path: &str) -> Value {
        self.objects.lock().unwrap()[path].clone()
    }
}

pub fn server_config(cert: &Path, key: &Path) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<_> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap(),
    )
}

fn serve_one(
    tls: &mut rustls::StreamOwned<rustls::ServerConnection, TcpStream>,
    objects: &Mutex<BTreeMap<String, Value>>,
    seen: &Mutex<Vec<Seen>>,
) -> std::io::Result<()> {
    tls.sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(&mut *tls);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut words = line.split_whitespace();
    let (method, path) = (
        words.next().unwrap_or("").to_string(),
        words.next().unwrap_or("").to_string(),
    );
    let (mut length, mut authorization, mut content_type) = (0, String::new(), String::new());
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        if h.trim().is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((&h, ""));
        match k.to_ascii_lowercase().as_str() {
            "content-length" => length = v.trim().parse().unwrap_or(0),
            "authorization" => authorization = v.trim().to_string(),
            "content-type" => content_type = v.trim().to_string(),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let body = String::from_utf8_lossy(&body).into_owned();
    seen.lock().unwrap().push(Seen {
        method: method.clone(),
        path: path.clone(),
        authorization,
        content_type,
        body: body.clone(),
    });
    let mut objects = objects.lock().unwrap();
    let (status, reply) = match (method.as_str(), objects.get_mut(&path)) {
        (_, None) => (404, r#"{"kind":"Status","code":404}"#.to_string()),
        ("GET", Some(o)) => (200, o.to_string()),
        ("PATCH", Some(o)) => {
            let patch: Vec<Value> = serde_json::from_str(&body).unwrap_or_default();
            let mut next = o.clone();
            match apply_patch(&mut next, &patch) {
                Ok(()) => {
                    let rv: u64 = next["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or("0")
                        .parse()
                        .unwrap_or(0);
                    next["metadata"]["resourceVersion"] = Value::from((rv + 1).to_string());
                    *o = next;
                    (200, o.to_string())
                }
                Err(e) => (
                    422,
                    serde_json::json!({"kind": "Status", "code": 422, "message": e}).to_string(),
                ),
            }
        }
        _ => (405, "{}".to_string()),
    };
    drop(objects);
    // Chunked, as Go's net/http answers a body it did not measure first.
    let head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    let mut out = head.into_bytes();
    let (a, b) = reply.as_bytes().split_at(reply.len() / 2);
    for chunk in [a, b] {
        out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    tls.write_all(&out)?;
    tls.flush()?;
    tls.conn.send_close_notify();
    tls.flush()
}
