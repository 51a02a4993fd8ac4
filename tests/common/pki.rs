//! Certificates made in the test (rcgen): a CA, a server certificate for `localhost` and
//! 127.0.0.1, a client certificate, and a second CA nothing trusts; plus a TLS client.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpStream;

/// Paths of the PEM files written.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A CA that signed nothing here.
    pub other_ca: PathBuf,
    /// A client certificate signed by `other_ca`.
    pub stranger_cert: PathBuf,
    pub stranger_key: PathBuf,
    /// A server certificate for the DNS name `api.hosted.test` only (no IP address).
    pub named_cert: PathBuf,
    pub named_key: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
}

fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    cn: &str,
    names: &[&str],
    dir: &Path,
    stem: &str,
) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().unwrap();
    let mut p =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    let cert = p.signed_by(&key, issuer).unwrap();
    let (c, k) = (
        dir.join(format!("{stem}.pem")),
        dir.join(format!("{stem}.key")),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

/// Writes a fresh set into `dir`.
pub fn make(dir: &Path) -> Pki {
    let ca1 = ca("inferscope test CA");
    let ca2 = ca("some other CA");
    let (server_cert, server_key) = leaf(
        &ca1,
        "localhost",
        &["localhost", "127.0.0.1"],
        dir,
        "server",
    );
    let (client_cert, client_key) = leaf(&ca1, "client-a", &["client-a"], dir, "client");
    let (stranger_cert, stranger_key) = leaf(&ca2, "stranger", &["stranger"], dir, "stranger");
    let (named_cert, named_key) = leaf(&ca1, "api.hosted.test", &["api.hosted.test"], dir, "named");
    let (ca, other_ca) = (dir.join("ca.pem"), dir.join("other-ca.pem"));
    std::fs::write(&ca, ca1.pem()).unwrap();
    std::fs::write(&other_ca, ca2.pem()).unwrap();
    Pki {
        ca,
        server_cert,
        server_key,
        client_cert,
        client_key,
        other_ca,
        stranger_cert,
        stranger_key,
        named_cert,
        named_key,
    }
}

/// Writes a new server certificate (same CA) over `pki.server_cert`/`server_key`, signed by a
/// fresh CA written to `ca_out`.
pub fn reissue_server(dir: &Path, ca_out: &Path) -> String {
    let ca1 = ca("inferscope test CA 2");
    std::fs::write(ca_out, ca1.pem()).unwrap();
    let (c, _) = leaf(
        &ca1,
        "localhost-2",
        &["localhost", "127.0.0.1"],
        dir,
        "server",
    );
    std::fs::read_to_string(c).unwrap()
}

/// A rustls client trusting `ca`, presenting `identity` (cert, key) if given, offering `alpn`.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    alpn: &[&[u8]],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut c = match identity {
        Some((cert, key)) => b
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(cert)
                    .unwrap()
                    .map(|c| c.unwrap())
                    .collect(),
                PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
        None => b.with_no_client_auth(),
    };
    c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(c)
}

/// A TLS connection to `addr` as `localhost`.
pub async fn connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}
