//! TLS both ways, on rustls with the `ring` provider.
//!
//! - `ServerTls`: terminates TLS on a listener (data or admin plane) from a PEM certificate chain
//!   and key, offers ALPN `h2` and `http/1.1`, and optionally verifies client certificates against
//!   a CA bundle (mTLS, required or optional). The files are read again by `reload` (SIGHUP, or
//!   `reload_if_changed` when a modification time moves); a reload that fails keeps the running
//!   certificate. New handshakes use the new one, established connections keep theirs.
//! - `ClientTls`: the upstream side (backends, OTLP over HTTP): roots from the bundled Mozilla set
//!   (`webpki`), the host's store (`native`), or none, plus an optional CA bundle; an optional
//!   client certificate; an optional server name that replaces the URL's host for SNI and
//!   verification.
//! - `connect`: the connector seam every upstream connection goes through: TCP, then TLS when the
//!   backend has it, within one timeout; the `Stream` it returns says which ALPN protocol was
//!   agreed, so an HTTP/2 upstream can be chosen on it.

use crate::clock::StampedTcp;
use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Why TLS material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM item.
    #[error("{}: {what}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// rustls refused the combination (a key that does not match the certificate, …).
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built (an empty CA bundle, …).
    #[error("client_ca: {0}")]
    Verifier(String),
    /// `server_name` is not a DNS name or IP address.
    #[error("server_name `{0}` is not a DNS name or IP address")]
    ServerName(String),
}

fn file_error(path: &Path, what: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.to_owned(),
        what: what.to_string(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file (at least one).
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem =
        crate::util::fs::read(path, crate::util::fs::PEM_CAP).map_err(|e| file_error(path, e))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(file_error(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem =
        crate::util::fs::read(path, crate::util::fs::PEM_CAP).map_err(|e| file_error(path, e))?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| file_error(path, format!("no usable PEM private key: {e}")))
}

fn roots_from(paths: &[&Path]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for p in paths {
        for c in read_certs(p)? {
            roots
                .add(c)
                .map_err(|e| file_error(p, format!("not a usable CA certificate: {e}")))?;
        }
    }
    Ok(roots)
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Where a listener's TLS material lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA bundle client certificates are verified against (mTLS).
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: a client without a certificate is refused (else it may proceed, and
    /// only a presented certificate is verified).
    pub client_cert_required: bool,
}

impl ServerFiles {
    fn paths(&self) -> Vec<&Path> {
        let mut v = vec![self.cert.as_path(), self.key.as_path()];
        v.extend(self.client_ca.as_deref());
        v
    }

    fn build(&self) -> Result<ServerConfig, TlsError> {
        let certs = read_certs(&self.cert)?;
        let key = read_key(&self.key)?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let roots = Arc::new(roots_from(&[ca])?);
                let v =
                    rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider());
                let v = if self.client_cert_required {
                    v
                } else {
                    v.allow_unauthenticated()
                };
                builder.with_client_cert_verifier(
                    v.build().map_err(|e| TlsError::Verifier(e.to_string()))?,
                )
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(certs, key)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// A listener's TLS configuration, reloadable.
#[derive(Debug)]
pub struct ServerTls {
    files: ServerFiles,
    current: ArcSwap<ServerConfig>,
    loaded: parking_lot::Mutex<Vec<Option<SystemTime>>>,
    last_rejection: parking_lot::Mutex<Option<String>>,
}

impl ServerTls {
    /// Loads the files (blocking file reads: call at startup or off the runtime).
    pub fn load(files: ServerFiles) -> Result<Self, TlsError> {
        let stamps = files.paths().into_iter().map(mtime).collect();
        let config = files.build()?;
        Ok(Self {
            files,
            current: ArcSwap::from_pointee(config),
            loaded: parking_lot::Mutex::new(stamps),
            last_rejection: parking_lot::Mutex::default(),
        })
    }

    /// The files it serves from.
    pub fn files(&self) -> &ServerFiles {
        &self.files
    }

    /// The acceptor for the next handshake.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.load_full())
    }

    /// Reads the files again; on success new handshakes use them, on failure the running
    /// configuration stays. Blocking file reads.
    pub fn reload(&self) -> Result<(), TlsError> {
        let stamps: Vec<_> = self.files.paths().into_iter().map(mtime).collect();
        *self.loaded.lock() = stamps;
        let config = self.files.build()?;
        self.current.store(Arc::new(config));
        Ok(())
    }

    /// Remembers the last reload's rejection (`None` after a success); true when `rejection` is
    /// news, i.e. differs from the one before (so the same bad file is logged once).
    pub fn note_rejection(&self, rejection: Option<String>) -> bool {
        let mut last = self.last_rejection.lock();
        let news = rejection.is_some() && *last != rejection;
        *last = rejection;
        news
    }

    /// Reloads when a file's modification time differs from the one last loaded; `None` when
    /// nothing changed.
    pub fn reload_if_changed(&self) -> Option<Result<(), TlsError>> {
        let now: Vec<_> = self.files.paths().into_iter().map(mtime).collect();
        if *self.loaded.lock() == now {
            return None;
        }
        Some(self.reload())
    }
}

/// Which roots verify upstream servers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Roots {
    /// Mozilla's set, bundled in the binary (works in a bare container).
    #[default]
    Webpki,
    /// The host's certificate store.
    Native,
    /// None: only the given CA bundle.
    None,
}

/// How to reach an upstream over TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientFiles {
    /// Built-in roots trusted.
    pub roots: Roots,
    /// A PEM CA bundle trusted as well (a private CA, a test CA).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for upstreams that require one.
    pub cert: Option<PathBuf>,
    /// Its PEM private key.
    pub key: Option<PathBuf>,
    /// Name sent in SNI and verified against the certificate, instead of the URL's host.
    pub server_name: Option<String>,
}

/// A TLS client configuration for one upstream (or exporter).
#[derive(Debug)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl ClientTls {
    /// Builds the configuration offering `alpn` (blocking file reads).
    pub fn new(files: &ClientFiles, alpn: &[&[u8]]) -> Result<Self, TlsError> {
        let mut roots = match &files.ca_file {
            Some(p) => roots_from(&[p])?,
            None => RootCertStore::empty(),
        };
        match files.roots {
            Roots::Webpki => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            Roots::Native => {
                let found = rustls_native_certs::load_native_certs();
                for c in found.certs {
                    // A certificate of the host's store that rustls cannot parse is skipped, as
                    // every client using that store does.
                    let _ = roots.add(c);
                }
            }
            Roots::None => {}
        }
        if roots.is_empty() {
            return Err(TlsError::Verifier(
                "no trusted roots: give ca_file or roots webpki|native".into(),
            ));
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let mut config = match (&files.cert, &files.key) {
            (Some(c), Some(k)) => builder.with_client_auth_cert(read_certs(c)?, read_key(k)?)?,
            _ => builder.with_no_client_auth(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let server_name = match &files.server_name {
            Some(n) => {
                Some(ServerName::try_from(n.clone()).map_err(|_| TlsError::ServerName(n.clone()))?)
            }
            None => None,
        };
        Ok(Self {
            config: Arc::new(config),
            server_name,
        })
    }

    /// The same trust and client certificate, offering `alpn` instead.
    pub fn with_alpn(&self, alpn: &[&[u8]]) -> Self {
        let mut config = ClientConfig::clone(&self.config);
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Self {
            config: Arc::new(config),
            server_name: self.server_name.clone(),
        }
    }

    /// The rustls configuration (for clients built elsewhere, e.g. the gRPC exporter).
    pub fn config(&self) -> &Arc<ClientConfig> {
        &self.config
    }

    /// Performs the handshake on `tcp` for `host` (or the configured server name).
    pub async fn handshake<S>(
        &self,
        host: &str,
        tcp: S,
    ) -> io::Result<tokio_rustls::client::TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let name = match &self.server_name {
            Some(n) => n.clone(),
            None => {
                // `[::1]` in a URL is `::1` to TLS.
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                ServerName::try_from(bare.to_owned()).map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("`{host}` is not a TLS server name"),
                    )
                })?
            }
        };
        tokio_rustls::TlsConnector::from(Arc::clone(&self.config))
            .connect(name, tcp)
            .await
    }
}

/// An upstream connection: plain TCP or TLS over it, read with kernel receive stamps.
#[derive(Debug)]
pub enum Stream {
    /// `http://`.
    Plain(StampedTcp),
    /// `https://`.
    Tls(Box<tokio_rustls::client::TlsStream<StampedTcp>>),
}

impl Stream {
    /// The kernel receive stamp of the latest read on the socket (`clock::pack`; 0 until one).
    pub fn rx_cell(&self) -> Arc<std::sync::atomic::AtomicU64> {
        match self {
            Stream::Plain(s) => s.rx_cell(),
            Stream::Tls(s) => s.get_ref().0.rx_cell(),
        }
    }

    /// The ALPN protocol the server chose (`None` over plain TCP or without ALPN).
    pub fn alpn(&self) -> Option<&[u8]> {
        match self {
            Stream::Plain(_) => None,
            Stream::Tls(s) => s.get_ref().1.alpn_protocol(),
        }
    }
}

/// Connects to `host:port` — TLS on top when `tls` is given — all within `timeout`.
pub async fn connect(
    host: &str,
    port: u16,
    tls: Option<&ClientTls>,
    timeout: Duration,
) -> io::Result<Stream> {
    connect_with(host, port, tls, timeout, false).await
}

/// `connect`, with kernel receive stamps on every read when `stamps` (the proxy's upstream
/// connections; see `clock`).
pub async fn connect_with(
    host: &str,
    port: u16,
    tls: Option<&ClientTls>,
    timeout: Duration,
    stamps: bool,
) -> io::Result<Stream> {
    let attempt = async {
        let tcp =
            TcpStream::connect((host.trim_start_matches('[').trim_end_matches(']'), port)).await?;
        // Small SSE writes must leave at once: no Nagle delay.
        let _ = tcp.set_nodelay(true);
        let tcp = if stamps {
            StampedTcp::stamped(tcp)
        } else {
            StampedTcp::new(tcp, false)
        };
        match tls {
            None => Ok(Stream::Plain(tcp)),
            Some(t) => Ok(Stream::Tls(Box::new(t.handshake(host, tcp).await?))),
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))?
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A connector for hyper-util's pooled client (the load generator, the eval runner): `http://`
/// over TCP, `https://` over TLS with `tls` (refused without it), within `timeout`.
#[derive(Debug, Clone)]
pub struct Connector {
    tls: Option<Arc<ClientTls>>,
    timeout: Duration,
}

impl Connector {
    /// A connector; `tls` is used for `https://` URIs.
    pub fn new(tls: Option<Arc<ClientTls>>, timeout: Duration) -> Self {
        Self { tls, timeout }
    }

    /// For `url`: TLS with the bundled roots (plus `ca_file`) when it is `https://` (blocking
    /// file reads), offering `alpn`.
    pub fn for_url(url: &str, ca_file: Option<PathBuf>, alpn: &[&[u8]]) -> Result<Self, TlsError> {
        let tls = if url.starts_with("https://") {
            let files = ClientFiles {
                ca_file,
                ..ClientFiles::default()
            };
            Some(Arc::new(ClientTls::new(&files, alpn)?))
        } else {
            None
        };
        Ok(Self::new(tls, Duration::from_secs(30)))
    }
}

impl tower::Service<http::Uri> for Connector {
    type Response = Connection;
    type Error = io::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = io::Result<Connection>> + Send + 'static>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let tls = match uri.scheme_str() {
            Some("https") => match &self.tls {
                Some(t) => Some(Arc::clone(t)),
                None => {
                    return Box::pin(std::future::ready(Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "https:// without TLS settings",
                    ))))
                }
            },
            _ => None,
        };
        let timeout = self.timeout;
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "URI has no host"))?
                .to_owned();
            let port = uri
                .port_u16()
                .unwrap_or(if tls.is_some() { 443 } else { 80 });
            let s = connect(&host, port, tls.as_deref(), timeout).await?;
            Ok(Connection(hyper_util::rt::TokioIo::new(s)))
        })
    }
}

/// A connection made by `Connector`.
#[derive(Debug)]
pub struct Connection(hyper_util::rt::TokioIo<Stream>);

impl hyper_util::client::legacy::connect::Connection for Connection {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        let c = hyper_util::client::legacy::connect::Connected::new();
        if self.0.inner().alpn() == Some(b"h2") {
            c.negotiated_h2()
        } else {
            c
        }
    }
}

impl hyper::rt::Read for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}
