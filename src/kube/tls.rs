//! TLS configurations: the webhook's server certificate from the PEM files a
//! cert-manager Secret mounts (`tls.crt`, `tls.key`), read again when they change, and
//! the client's trust in the API server's CA (the service account's `ca.crt`).
//!
//! Rotation: the kubelet updates a mounted Secret by swapping a symlink (`..data`), so
//! the files' metadata (followed through the link) changes; every handshake compares it
//! with what was loaded (two stat calls) and loads the pair again when it differs. A
//! pair that does not load (a half-written file, a key that does not match) is reported
//! once and the previous pair kept, so a bad rotation never takes the webhook down.

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The largest certificate, key or CA file read (a chain of a few certificates is a
/// few KiB).
const MAX_PEM: u64 = 1 << 20;

/// The crypto provider for both ends: ring (see Cargo.toml for why).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A PEM file's bytes, at most `MAX_PEM` of them.
fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut data = Vec::new();
    file.take(MAX_PEM + 1)
        .read_to_end(&mut data)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if data.len() as u64 > MAX_PEM {
        return Err(format!("{}: larger than 1 MiB", path.display()));
    }
    Ok(data)
}

/// The certificates of a PEM file, in order; an error when there is none.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let data = read_pem(path)?;
    let certs = CertificateDer::pem_slice_iter(&data)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no CERTIFICATE in it", path.display()));
    }
    Ok(certs)
}

/// A certificate chain and its private key, checked to belong together.
fn certified_key(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, String> {
    let chain = certificates(cert)?;
    let key_der = PrivateKeyDer::from_pem_slice(&read_pem(key)?)
        .map_err(|e| format!("{}: {e}", key.display()))?;
    CertifiedKey::from_der(chain, key_der, provider).map_err(|e| {
        format!(
            "{} and {}: {e} (the key must be the certificate's)",
            cert.display(),
            key.display()
        )
    })
}

/// What identifies a file's version: its length, inode and modification time.
type Stamp = Option<(u64, u64, i64, i64)>;

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.ino(), m.mtime(), m.mtime_nsec()))
}

/// The server certificate, loaded again whenever its files change.
#[derive(Debug)]
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    /// The stamps of the pair last tried, and the pair in use.
    current: Mutex<((Stamp, Stamp), Arc<CertifiedKey>)>,
}

impl ReloadingCert {
    /// Loads the pair now: a webhook that cannot serve its certificate must not start.
    pub fn load(cert: &Path, key: &Path, provider: Arc<CryptoProvider>) -> Result<Self, String> {
        let stamps = (stamp(cert), stamp(key));
        let loaded = certified_key(cert, key, &provider)?;
        Ok(ReloadingCert {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            provider,
            current: Mutex::new((stamps, Arc::new(loaded))),
        })
    }

    /// The pair to present, loaded again first when the files changed.
    pub fn get(&self) -> Arc<CertifiedKey> {
        let stamps = (stamp(&self.cert), stamp(&self.key));
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.0 != stamps {
            // Tried once per change, whatever the outcome.
            current.0 = stamps;
            match certified_key(&self.cert, &self.key, &self.provider) {
                Ok(loaded) => {
                    current.1 = Arc::new(loaded);
                    crate::diagnostic::line(format_args!(
                        "nccl-preflight: webhook: loaded the rotated certificate {}",
                        self.cert.display().to_string().escape_debug()
                    ));
                }
                Err(e) => crate::diagnostic::line(format_args!(
                    "nccl-preflight: webhook: the changed certificate does not load, still serving the previous one: {}",
                    e.escape_debug()
                )),
            }
        }
        Arc::clone(&current.1)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }
}

/// The webhook's TLS: TLS 1.2 and 1.3, HTTP/1.1 by ALPN, the reloading certificate.
pub fn server_config(cert: Arc<ReloadingCert>) -> Result<rustls::ServerConfig, String> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A client trusting only the CAs of `ca` (the API server's, from the service account).
pub fn client_config(ca: &Path) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(ca)? {
        roots
            .add(cert)
            .map_err(|e| format!("{}: {e}", ca.display()))?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
