//! A connection accepted by a network input that may or may not speak TLS: one type for the
//! input's reading code either way.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::reload::ServerTls;

/// A plain stream, or a TLS session over one.
#[derive(Debug)]
pub enum ServerStream<S> {
    Plain(S),
    Tls(Box<tokio_rustls::server::TlsStream<S>>),
}

impl<S: AsyncRead + AsyncWrite + Unpin> ServerStream<S> {
    /// `stream` as is when `tls` is `None`, else after the TLS handshake.
    pub async fn accept(tls: Option<&Arc<ServerTls>>, stream: S) -> io::Result<ServerStream<S>> {
        match tls {
            None => Ok(ServerStream::Plain(stream)),
            Some(tls) => Ok(ServerStream::Tls(Box::new(tls.accept(stream).await?))),
        }
    }

    /// The subject of the client's certificate, when it sent one.
    pub fn peer_certificate_subject(&self) -> Option<String> {
        match self {
            ServerStream::Plain(_) => None,
            ServerStream::Tls(s) => crate::peer_certificate_subject(s.get_ref().1),
        }
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &S {
        match self {
            ServerStream::Plain(s) => s,
            ServerStream::Tls(s) => s.get_ref().0,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for ServerStream<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for ServerStream<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ServerStream::Plain(s) => s.is_write_vectored(),
            ServerStream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
