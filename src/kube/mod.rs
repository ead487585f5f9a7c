//! Kubernetes over HTTPS without a Kubernetes client: TLS (rustls with the ring
//! provider) for the webhook's server certificate and for the API server, one bounded
//! HTTP/1.1 message reader both ends share, and a small in-cluster API client (the
//! service account's token and CA) for the few calls the tool makes: GET and PATCH of
//! one object. Every connection, read and write runs under a deadline, and every
//! message has a size limit.

pub mod client;
pub mod message;
pub mod tls;

pub use client::ApiServer;
