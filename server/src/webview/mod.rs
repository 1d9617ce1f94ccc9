//! The web view at `/ui`, served by every replica on its HTTP port: read-only pages
//! of the cluster (replicas and Raft groups), the fleet (nodes and devices), gang
//! groups, queues and transactions. Pages are rendered on the server (`render`,
//! maud) from the replica's linearizable reads (`read`), so every replica shows the
//! same truth and keeps showing it when it loses its leaderships; each panel is
//! fetched again when the event hub (`events`) says its groups applied something.
//! The browser side is htmx with its SSE extension, vendored under `assets/` with
//! their licences, and `assets/ui.js`: no build step but `cargo build`.
//!
//! Unless the replica requires no credentials, every `/ui` path asks for a viewer
//! (`access`): `Authorization: Bearer`, or the session cookie the sign-in form sets.
//! Built by the entry points (`serve`, `dev`) with [`mounted`] and served beside the
//! HTTP endpoints by `observe::http::serve`; the state arrives through [`UiDeps`].

pub mod access;
pub mod events;
pub mod read;
pub mod render;

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use futures::Stream;
use maud::Markup;
use tokio_stream::StreamExt as _;

use crate::observe::http::MountedRoutes;
use crate::replicated::now_ms;
use access::{Refusal, UiAccess};
use events::{Hub, Panel};
use read::Source;
use render::{GangFilter, Page};

/// The cookie the sign-in form sets: a session id (never the token), HttpOnly, for
/// `/ui` only.
pub const UI_SESSION_COOKIE: &str = "gangway_ui_session";
/// Longest token the sign-in form takes, in bytes.
pub const UI_TOKEN_BYTES_MAX: usize = 4096;

/// What the web view needs from the process that serves it.
#[derive(Clone)]
pub struct UiDeps {
    /// Where it reads the cluster.
    pub source: Source,
    /// Who may see it.
    pub access: UiAccess,
}

#[derive(Clone)]
struct UiState {
    source: Source,
    access: UiAccess,
    hub: Hub,
}

/// The web view to mount beside the HTTP endpoints: the `/ui` routes and the task that
/// follows the replica's groups for live updates.
pub fn mounted(deps: UiDeps) -> MountedRoutes {
    let hub = Hub::default();
    let (stop_watch, watch_stopped) = tokio::sync::watch::channel(false);
    let host = deps.source.groups.host().clone();
    metrics::counter!("gangway_ui_clients_dropped_total").increment(0);
    let router = router(deps, hub.clone());
    let task = tokio::spawn(events::watch(host, hub.clone(), watch_stopped));
    MountedRoutes {
        router,
        close: Box::new(move || {
            // Open event streams would hold graceful shutdown until the drain bound.
            let _ = stop_watch.send(true);
            hub.close();
        }),
        task,
    }
}

/// The `/ui` routes over `deps`, announcing changes from `hub`.
pub fn router(deps: UiDeps, hub: Hub) -> Router {
    let state = UiState {
        source: deps.source,
        access: deps.access,
        hub,
    };
    let guarded = Router::new()
        .route("/ui", get(cluster_page))
        .route("/ui/", get(cluster_page))
        .route("/ui/fleet", get(fleet_page))
        .route("/ui/gangs", get(gangs_page))
        .route("/ui/queues", get(queues_page))
        .route("/ui/txns", get(txns_page))
        .route("/ui/panel/cluster", get(cluster_panel))
        .route("/ui/panel/fleet", get(fleet_panel))
        .route("/ui/panel/node", get(node_panel))
        .route("/ui/panel/gangs", get(gangs_panel))
        .route("/ui/panel/queues", get(queues_panel))
        .route("/ui/panel/txns", get(txns_panel))
        .route("/ui/events", get(events_stream))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .with_state(state.clone());
    Router::new()
        .route("/ui/login", post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/assets/{file}", get(asset))
        .with_state(state)
        .merge(guarded)
}

fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == UI_SESSION_COOKIE)
        .map(|(_, value)| value.to_string())
}

fn bearer_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string())
}

/// Whether the browser reached this page over TLS (a TLS-terminating proxy in front of
/// the plaintext HTTP port says so).
fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

fn refused(request_path: &str, refusal: Refusal) -> Response {
    let panel = request_path.starts_with("/ui/panel") || request_path == "/ui/events";
    let (code, text) = match refusal {
        Refusal::Unauthenticated(why) => (StatusCode::UNAUTHORIZED, why),
        Refusal::Forbidden(why) => (StatusCode::FORBIDDEN, why),
        Refusal::TooMany => (
            StatusCode::TOO_MANY_REQUESTS,
            "too many failed sign-ins from this address; wait a minute".to_string(),
        ),
        Refusal::Unavailable(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    };
    if panel {
        (code, text).into_response()
    } else {
        (code, Html(render::login(Some(&text)).into_string())).into_response()
    }
}

async fn require_token(State(state): State<UiState>, request: Request, next: Next) -> Response {
    if state.access.is_open() {
        return next.run(request).await;
    }
    let headers = request.headers();
    let path = request.uri().path().to_string();
    if let Some(token) = bearer_token(headers) {
        if let Err(refusal) = state.access.check_transport(over_tls(headers)) {
            return refused(&path, refusal);
        }
        return match state.access.viewer(&token).await {
            Ok(_) => next.run(request).await,
            Err(refusal) => refused(&path, refusal),
        };
    }
    match session_cookie(headers) {
        Some(id) => match state.access.session(&id, std::time::Instant::now()).await {
            Ok(_) => next.run(request).await,
            Err(refusal) => refused(&path, refusal),
        },
        None => {
            if path.starts_with("/ui/panel") || path == "/ui/events" {
                (StatusCode::UNAUTHORIZED, "sign in first").into_response()
            } else {
                (
                    StatusCode::UNAUTHORIZED,
                    Html(render::login(None).into_string()),
                )
                    .into_response()
            }
        }
    }
}

#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(
    State(state): State<UiState>,
    client: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    if state.access.is_open() {
        return Redirect::to("/ui").into_response();
    }
    let token = form.token.trim();
    if token.is_empty() || token.len() > UI_TOKEN_BYTES_MAX {
        return refused(
            "/ui/login",
            Refusal::Unauthenticated("token not accepted".into()),
        );
    }
    if let Err(refusal) = state.access.check_transport(over_tls(&headers)) {
        return refused("/ui/login", refusal);
    }
    let client = client.map(|c| c.0 .0.ip());
    let id = match state
        .access
        .sign_in(client, token, std::time::Instant::now())
        .await
    {
        Ok(id) => id,
        Err(refusal) => return refused("/ui/login", refusal),
    };
    let secure = if over_tls(&headers) { "; Secure" } else { "" };
    let cookie = format!(
        "{UI_SESSION_COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        access::UI_SESSION_TTL_MS / 1000
    );
    match HeaderValue::from_str(&cookie) {
        Ok(value) => {
            let mut response = Redirect::to("/ui").into_response();
            response.headers_mut().insert(header::SET_COOKIE, value);
            response
        }
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "session cookie").into_response(),
    }
}

async fn logout(State(state): State<UiState>, headers: HeaderMap) -> Response {
    if let Some(id) = session_cookie(&headers) {
        state.access.sign_out(&id);
    }
    let mut response = Redirect::to("/ui").into_response();
    let expired = format!("{UI_SESSION_COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0");
    if let Ok(value) = HeaderValue::from_str(&expired) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

const HTMX_JS: &str = include_str!("assets/htmx.min.js");
const HTMX_SSE_JS: &str = include_str!("assets/htmx-ext-sse.min.js");
const UI_JS: &str = include_str!("assets/ui.js");
const UI_CSS: &str = include_str!("assets/ui.css");

async fn asset(axum::extract::Path(file): axum::extract::Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "htmx.min.js" => (HTMX_JS, "text/javascript"),
        "htmx-ext-sse.min.js" => (HTMX_SSE_JS, "text/javascript"),
        "ui.js" => (UI_JS, "text/javascript"),
        "ui.css" => (UI_CSS, "text/css"),
        _ => return (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        body,
    )
        .into_response()
}

fn html(markup: Markup) -> Response {
    (
        [(header::CACHE_CONTROL, "no-store")],
        Html(markup.into_string()),
    )
        .into_response()
}

fn this_replica(state: &UiState) -> u64 {
    state.source.groups.host().node_id()
}

/// Leader of every group as this replica knows it.
fn leaders(state: &UiState) -> BTreeMap<u64, u64> {
    state
        .source
        .groups
        .host()
        .status(false)
        .into_iter()
        .filter(|g| g.leader != 0)
        .map(|g| (g.group_id, g.leader))
        .collect()
}

async fn cluster_markup(state: &UiState) -> Markup {
    render::cluster(&state.source.cluster().await)
}

async fn fleet_markup(state: &UiState) -> Markup {
    render::fleet(&state.source.fleet().await, &leaders(state))
}

#[derive(serde::Deserialize)]
struct NodeQuery {
    #[serde(default)]
    name: String,
}

async fn node_markup(state: &UiState, name: &str) -> Markup {
    match state.source.node(name).await {
        Ok(node) => render::node(node.as_ref(), name, now_ms()),
        Err(e) => render::unreadable(&format!("node {name}"), &e.to_string()),
    }
}

async fn gangs_markup(state: &UiState, filter: &GangFilter) -> Markup {
    match state.source.gangs().await {
        Ok(groups) => render::gangs(&groups, filter, now_ms()),
        Err(e) => render::unreadable("gang groups", &e.to_string()),
    }
}

async fn queues_markup(state: &UiState) -> Markup {
    match state.source.queues().await {
        Ok(view) => render::queues(&view),
        Err(e) => render::unreadable("queues", &e.to_string()),
    }
}

async fn txns_markup(state: &UiState) -> Markup {
    match state.source.txns().await {
        Ok(view) => render::txns(&view, now_ms()),
        Err(e) => render::unreadable("transactions", &e.to_string()),
    }
}

/// Panel `panel` with its first content, refreshed from `/ui/panel/NAME` on its event.
fn live(panel: Panel, include: Option<&str>, body: Markup) -> Markup {
    let name = panel.name();
    render::live(
        &format!("p-{name}"),
        name,
        &format!("/ui/panel/{name}"),
        include,
        body,
    )
}

async fn cluster_page(State(state): State<UiState>) -> Response {
    let body = live(Panel::Cluster, None, cluster_markup(&state).await);
    html(render::page(Page::Cluster, this_replica(&state), body))
}

async fn fleet_page(State(state): State<UiState>, Query(q): Query<NodeQuery>) -> Response {
    let fleet = live(Panel::Fleet, None, fleet_markup(&state).await);
    let node = if q.name.is_empty() {
        maud::html! { p.hint { "click a node for its pods, devices, agent link and lease" } }
    } else {
        node_markup(&state, &q.name).await
    };
    let body = maud::html! {
        div.split {
            div.left { (fleet) }
            aside #node { (node) }
        }
    };
    html(render::page(Page::Fleet, this_replica(&state), body))
}

async fn gangs_page(State(state): State<UiState>, Query(filter): Query<GangFilter>) -> Response {
    let body = live(
        Panel::Gangs,
        Some("#gang-filter"),
        gangs_markup(&state, &filter).await,
    );
    html(render::page(Page::Gangs, this_replica(&state), body))
}

async fn queues_page(State(state): State<UiState>) -> Response {
    let body = live(Panel::Queues, None, queues_markup(&state).await);
    html(render::page(Page::Queues, this_replica(&state), body))
}

async fn txns_page(State(state): State<UiState>) -> Response {
    let body = live(Panel::Txns, None, txns_markup(&state).await);
    html(render::page(Page::Txns, this_replica(&state), body))
}

async fn cluster_panel(State(state): State<UiState>) -> Response {
    html(cluster_markup(&state).await)
}

async fn fleet_panel(State(state): State<UiState>) -> Response {
    html(fleet_markup(&state).await)
}

async fn node_panel(State(state): State<UiState>, Query(q): Query<NodeQuery>) -> Response {
    if q.name.is_empty() {
        return (StatusCode::BAD_REQUEST, "name: must not be empty").into_response();
    }
    html(node_markup(&state, &q.name).await)
}

async fn gangs_panel(State(state): State<UiState>, Query(filter): Query<GangFilter>) -> Response {
    html(gangs_markup(&state, &filter).await)
}

async fn queues_panel(State(state): State<UiState>) -> Response {
    html(queues_markup(&state).await)
}

async fn txns_panel(State(state): State<UiState>) -> Response {
    html(txns_markup(&state).await)
}

async fn events_stream(State(state): State<UiState>) -> Response {
    match state.hub.subscribe() {
        Ok(rx) => Sse::new(panel_events(rx))
            .keep_alive(KeepAlive::default())
            .into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

fn panel_events(
    rx: tokio::sync::mpsc::Receiver<Panel>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    // A browser drops an event whose data is empty: each carries its panel's name.
    let hello = futures::stream::once(async { Ok(Event::default().event("hello").data("hello")) });
    let changes = tokio_stream::wrappers::ReceiverStream::new(rx)
        .map(|panel| Ok(Event::default().event(panel.name()).data(panel.name())));
    futures::StreamExt::chain(hello, changes)
}
