//! The API server as a pod reaches it: `KUBERNETES_SERVICE_HOST` and `_PORT`, the
//! service account's `ca.crt` for the server's certificate and its `token` (read again
//! for every call: the kubelet rotates projected tokens) as the bearer, as client-go's
//! rest.InClusterConfig does (k8s.io/client-go rest/config.go). One connection per call,
//! `Connection: close`, the whole call under `CALL_TIME`, the reply under `MAX_REPLY`.

use super::message::{self, Message};
use std::io::Read;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the kubelet mounts the service account's credentials.
pub const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// One call, connection and TLS handshake included.
const CALL_TIME: Duration = Duration::from_secs(10);
/// The largest reply read: a Node object with its image list is tens of KiB.
const MAX_REPLY: usize = 4 << 20;
/// The largest token read (a projected token is about 1 KiB).
const MAX_TOKEN: u64 = 64 * 1024;

#[derive(Clone)]
pub struct ApiServer {
    host: String,
    port: u16,
    token: PathBuf,
    tls: Arc<rustls::ClientConfig>,
}

/// A reply: its status and body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

impl ApiServer {
    /// The API server this pod's service account reaches; `account` is the directory
    /// holding `ca.crt` and `token` (SERVICE_ACCOUNT in a pod).
    pub fn in_cluster(
        env: &[(std::ffi::OsString, std::ffi::OsString)],
        account: &Path,
    ) -> Result<ApiServer, String> {
        let var = |name: &str| {
            env.iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.to_str())
                .map(str::to_string)
                .ok_or_else(|| format!("{name} is not set (the kubelet sets it in every pod)"))
        };
        let host = var("KUBERNETES_SERVICE_HOST")?;
        let port = var("KUBERNETES_SERVICE_PORT")?
            .parse()
            .map_err(|_| "KUBERNETES_SERVICE_PORT is not a port".to_string())?;
        let tls = super::tls::client_config(&account.join("ca.crt"))?;
        Ok(ApiServer {
            host,
            port,
            token: account.join("token"),
            tls: Arc::new(tls),
        })
    }

    fn token(&self) -> Result<String, String> {
        let file = std::fs::File::open(&self.token)
            .map_err(|e| format!("{}: {e}", self.token.display()))?;
        let mut text = String::new();
        file.take(MAX_TOKEN)
            .read_to_string(&mut text)
            .map_err(|e| format!("{}: {e}", self.token.display()))?;
        let token = text.trim();
        if token.is_empty() || token.bytes().any(|b| !b.is_ascii_graphic()) {
            return Err(format!("{}: not a bearer token", self.token.display()));
        }
        Ok(token.to_string())
    }

    fn address(&self) -> Result<SocketAddr, String> {
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| format!("{}: {e}", self.host))?
            .next()
            .ok_or_else(|| format!("{}: no address", self.host))
    }

    /// One call: `method` on `path` (already escaped: callers build it from names they
    /// have checked), with a body of the given content type when there is one.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, &[u8])>,
    ) -> Result<Reply, String> {
        self.call_within(method, path, body, CALL_TIME)
    }

    /// `call`, all of it within `within`.
    pub fn call_within(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, &[u8])>,
        within: Duration,
    ) -> Result<Reply, String> {
        let until = Instant::now() + within;
        let token = self.token()?;
        let server_name = rustls::pki_types::ServerName::try_from(self.host.clone())
            .map_err(|e| format!("{}: {e}", self.host))?;
        let socket = TcpStream::connect_timeout(&self.address()?, within)
            .map_err(|e| format!("connecting to {}:{}: {e}", self.host, self.port))?;
        let connection = rustls::ClientConnection::new(Arc::clone(&self.tls), server_name)
            .map_err(|e| e.to_string())?;
        let mut stream = rustls::StreamOwned::new(connection, socket);
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}:{}\r\nAuthorization: Bearer {token}\r\nAccept: application/json\r\nUser-Agent: nccl-preflight/{}\r\nConnection: close\r\n",
            self.host,
            self.port,
            env!("CARGO_PKG_VERSION")
        )
        .into_bytes();
        if let Some((content_type, data)) = body {
            request.extend_from_slice(
                format!(
                    "Content-Type: {content_type}\r\nContent-Length: {}\r\n",
                    data.len()
                )
                .as_bytes(),
            );
            request.extend_from_slice(b"\r\n");
            request.extend_from_slice(data);
        } else {
            request.extend_from_slice(b"\r\n");
        }
        message::write_all(&mut stream, &request, until)
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let Message { status, body, .. } = message::read(&mut stream, false, MAX_REPLY, until)
            .map_err(|e| format!("{method} {path}: {e}"))?;
        Ok(Reply { status, body })
    }
}

/// A name the API server takes as one path segment: a DNS subdomain (RFC 1123, at most
/// 253 characters), as a Node's or a namespace's name is; nothing in it needs escaping.
pub fn is_object_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn object_names_are_dns_subdomains_and_nothing_else() {
        for ok in ["ip-10-0-1-2.ec2.internal", "node1", "a-b"] {
            assert!(super::is_object_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Node1",
            "a/b",
            "a..b",
            "-a",
            "a?x=1",
            "a b",
            "%2e%2e",
            &"a".repeat(254),
        ] {
            assert!(!super::is_object_name(bad), "{bad}");
        }
    }
}
