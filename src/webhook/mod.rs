//! `webhook`: a mutating admission webhook that injects the check into GPU pods of the
//! namespaces that opt in (the MutatingWebhookConfiguration's namespaceSelector picks
//! them; inject.rs says what is added). It answers `POST /mutate` over HTTPS with the
//! certificate cert-manager mounts (kube::tls reloads it on rotation), and /metrics,
//! /healthz and /readyz over plain HTTP on another port (serve's server).
//!
//! It never stands between a user and a pod: every answer allows the pod, and anything
//! that goes wrong (a review it cannot read, an MPIJob it cannot look up) leaves the pod
//! as it was, with a log line naming the pod and the reason and
//! `nccl_preflight_webhook_reviews_total{outcome="failed_open"}`; a webhook that does
//! not answer at all is ignored by the API server (`failurePolicy: Ignore`). Bounds: at
//! most `MAX_CONNECTIONS` connections, a review of at most `MAX_REVIEW` bytes, each
//! request within `REQUEST_TIME` of the previous answer (keep-alive included).

mod inject;
mod review;
mod stats;

use crate::cli::WebhookArgs;
use crate::kube::message::{self, Timed};
use crate::run::Exit;
use anyhow::{Context, Result};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The API server sends objects of at most 3 MiB (k8s.io/apiserver MaxRequestBodyBytes);
/// a review carries one Pod and its metadata.
const MAX_REVIEW: usize = 4 << 20;
const MAX_CONNECTIONS: usize = 64;
/// A request (and the handshake before the first) must arrive within this.
const REQUEST_TIME: Duration = Duration::from_secs(15);
/// An answer must be written within this.
const RESPONSE_TIME: Duration = Duration::from_secs(5);
/// How long an MPIJob lookup may take: under the webhook's own timeoutSeconds (5).
const LOOKUP_TIME: Duration = Duration::from_secs(2);

/// What the connection threads share.
struct Webhook {
    settings: inject::Settings,
    stats: stats::Stats,
    owners: Option<stats::Owners>,
}

pub fn webhook(
    args: &WebhookArgs,
    env: &[(std::ffi::OsString, std::ffi::OsString)],
    config: Option<&crate::config::Config>,
) -> Result<Exit> {
    let Some(image) = args.inject_image.clone() else {
        anyhow::bail!(
            "--inject-image (NCCL_PREFLIGHT_INJECT_IMAGE): the image to inject is not set"
        );
    };
    let provider = crate::kube::tls::provider();
    let cert = crate::kube::tls::ReloadingCert::load(&args.tls_cert, &args.tls_key, provider)
        .map_err(anyhow::Error::msg)
        .context("loading the webhook's certificate (--tls-cert, --tls-key)")?;
    let tls =
        Arc::new(crate::kube::tls::server_config(Arc::new(cert)).map_err(anyhow::Error::msg)?);
    let listener =
        TcpListener::bind(&args.listen).with_context(|| format!("binding {}", args.listen))?;
    let metrics = TcpListener::bind(&args.metrics_listen)
        .with_context(|| format!("binding {}", args.metrics_listen))?;
    let owners = match crate::kube::ApiServer::in_cluster(env, &args.service_account) {
        Ok(api) => Some(stats::Owners::new(api, LOOKUP_TIME)),
        Err(e) => {
            crate::diagnostic::line(format_args!(
                "nccl-preflight: webhook: no API access ({}): MPIJob workers get no --nodes unless the pod says it ({})",
                crate::render::visible(&e),
                inject::NODES
            ));
            None
        }
    };
    let shared = Arc::new(Webhook {
        settings: settings(args, image, config),
        stats: stats::Stats::default(),
        owners,
    });
    let bound = |l: &TcpListener, given: &str| {
        l.local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| given.to_string())
    };
    crate::diagnostic::line(format_args!(
        "nccl-preflight: webhook: serving POST /mutate on https://{}, metrics on http://{}",
        bound(&listener, &args.listen),
        bound(&metrics, &args.metrics_listen)
    ));
    let stop = crate::serve::stop_on_signals()?;
    start_metrics(metrics, &shared, stop)?;
    accept(listener, &tls, &shared, stop)?;
    Ok(Exit::new(
        crate::run::EXIT_OK,
        crate::gather::gpu::HungCall::default(),
    ))
}

/// The injection settings: the image, the mode, and the configuration file's flags for
/// the injected mode, with the variable that overrides each (config.rs's order).
fn settings(
    args: &WebhookArgs,
    image: String,
    config: Option<&crate::config::Config>,
) -> inject::Settings {
    let command = crate::cli::command();
    let flags_for = |mode: &str| -> Vec<(String, String, String)> {
        let (Some(config), Some(sub)) = (config, command.find_subcommand(mode)) else {
            return Vec::new();
        };
        config
            .for_mode(mode)
            .into_iter()
            .filter_map(|(key, value)| {
                let arg = sub
                    .get_arguments()
                    .find(|a| a.get_long() == Some(key.as_str()))?;
                let var = arg
                    .get_env()
                    .map(|v| v.to_string_lossy().into_owned())
                    .unwrap_or_default();
                Some((key, var, value))
            })
            .collect()
    };
    inject::Settings {
        image,
        mode: match args.inject_mode {
            crate::cli::InjectMode::Init => inject::Mode::Init,
            crate::cli::InjectMode::Exec => inject::Mode::Exec,
        },
        init_flags: flags_for("init"),
        exec_flags: flags_for("exec"),
    }
}

/// /metrics, /healthz and /readyz on plain HTTP, through serve's bounded server.
fn start_metrics(
    listener: TcpListener,
    shared: &Arc<Webhook>,
    stop: &'static AtomicBool,
) -> Result<()> {
    let shared = Arc::clone(shared);
    let route = Arc::new(move |path: &str| match path {
        "/healthz" | "/readyz" => crate::serve::http::Response::text(200, "ok\n"),
        "/metrics" => crate::serve::http::Response {
            status: 200,
            content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
            body: shared.stats.render(),
        },
        _ => {
            crate::serve::http::Response::text(404, "not found: try /metrics, /healthz, /readyz\n")
        }
    });
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            if let Err(e) =
                crate::serve::http::serve(listener, stop, route, &["/healthz", "/readyz"])
            {
                crate::diagnostic::line(format_args!(
                    "nccl-preflight: webhook: the metrics server stopped: {e}"
                ));
            }
        })
        .context("starting the metrics server")?;
    Ok(())
}

/// Accepts connections until `stop`, each on a thread of its own, at most
/// `MAX_CONNECTIONS` at once (more are closed at once: the API server then fails open).
fn accept(
    listener: TcpListener,
    tls: &Arc<rustls::ServerConfig>,
    shared: &Arc<Webhook>,
    stop: &'static AtomicBool,
) -> Result<()> {
    use std::os::fd::AsFd;
    listener.set_nonblocking(true)?;
    let active = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [nix::poll::PollFd::new(
            listener.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(100u8)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        let Ok((socket, _)) = listener.accept() else {
            continue;
        };
        if active.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            shared.stats.refused();
            continue;
        }
        let _ = socket.set_nonblocking(false);
        active.fetch_add(1, Ordering::Relaxed);
        let (tls, shared, done) = (Arc::clone(tls), Arc::clone(shared), Arc::clone(&active));
        let spawned = std::thread::Builder::new()
            .name("webhook".into())
            .spawn(move || {
                connection(socket, tls, &shared);
                done.fetch_sub(1, Ordering::Relaxed);
            });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Serves one connection's requests until the client closes it or stalls.
fn connection(socket: TcpStream, tls: Arc<rustls::ServerConfig>, shared: &Webhook) {
    let Ok(conn) = rustls::ServerConnection::new(tls) else {
        return;
    };
    let mut stream = rustls::StreamOwned::new(conn, socket);
    loop {
        let request =
            match message::read(&mut stream, true, MAX_REVIEW, Instant::now() + REQUEST_TIME) {
                Ok(r) => r,
                // The client closed between requests, or the handshake failed: nothing to answer.
                Err(message::Refusal::Closed(_)) if !stream.conn.is_handshaking() => return,
                Err(message::Refusal::Timeout) | Err(message::Refusal::Closed(_)) => return,
                Err(refusal) => {
                    shared.stats.refused();
                    let body = format!("{refusal}\n");
                    let _ = respond(&mut stream, refusal.status(), "text/plain", body.as_bytes());
                    return;
                }
            };
        let (status, content_type, body) = match (request.method.as_str(), request.path.as_str()) {
            ("POST", "/mutate") => match mutate(shared, &request.body) {
                Ok(answer) => (200, "application/json", answer),
                Err(why) => (400, "text/plain", why),
            },
            ("GET", "/healthz" | "/readyz") => (200, "text/plain", "ok\n".to_string()),
            _ => (404, "text/plain", "not found: POST /mutate\n".to_string()),
        };
        if respond(&mut stream, status, content_type, body.as_bytes()).is_err() {
            return;
        }
    }
}

fn respond(
    stream: &mut impl Timed,
    status: u16,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        _ => "Bad Request",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    message::write_all(stream, &out, Instant::now() + RESPONSE_TIME)
}

/// One review: the answer, always allowing the pod; a log line and a count for each.
/// A body that is no review gets an error (the API server then fails open).
fn mutate(shared: &Webhook, body: &[u8]) -> Result<String, String> {
    let started = Instant::now();
    let review = match review::parse(body) {
        Ok(r) => r,
        Err(e) => {
            // No uid to answer with: the API server counts this as a failed call and,
            // under failurePolicy Ignore, admits the pod.
            shared.stats.review("failed_open", started.elapsed());
            crate::diagnostic::line(format_args!(
                "nccl-preflight: webhook: not a review, nothing injected (failing open): {}",
                crate::render::visible(&e)
            ));
            return Err(format!("not an AdmissionReview: {e}\n"));
        }
    };
    let Some(pod) = &review.pod else {
        shared.stats.review("skipped", started.elapsed());
        return Ok(review::answer(&review, None));
    };
    let who = crate::render::visible(&review::pod_label(&review.namespace, pod)).into_owned();
    let owner = shared
        .owners
        .as_ref()
        .and_then(|o| o.mpi_workers(&review.namespace, pod, &who));
    let (outcome, patch, line) = match inject::decide(pod, &shared.settings, owner) {
        inject::Decision::Inject {
            mode,
            nodes,
            patch,
            note,
        } => {
            let nodes = nodes.map(|n| format!(" --nodes={n}")).unwrap_or_default();
            let note = note.map(|n| format!(" ({n})")).unwrap_or_default();
            (
                "injected",
                Some(patch),
                format!("injected {}{nodes}{note}", mode.name()),
            )
        }
        inject::Decision::Skip(why) => ("skipped", None, format!("skipped: {why}")),
    };
    shared.stats.review(outcome, started.elapsed());
    crate::diagnostic::line(format_args!(
        "nccl-preflight: webhook: {who}: {}",
        crate::render::visible(&line)
    ));
    Ok(review::answer(&review, patch.as_deref()))
}
