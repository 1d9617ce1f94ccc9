//! The web view at `/ui`, served by every replica on its HTTP port: read-only pages
//! of the cluster (replicas and Raft groups), the fleet (nodes and devices), gang
//! groups, queues and transactions. Pages are rendered on the server (`render`,
//! maud) from the replica's linearizable reads (`read`), so every replica shows the
//! same truth and keeps showing it when it loses its leaderships; each panel is
//! fetched again when the event hub (`events`) says its groups applied something.
//! The browser side is htmx with its SSE extension, vendored under `assets/` with
//! their licences, and `assets/ui.js`: no build step but `cargo build`.
//!
//! When the replica has `--auth-tokens-file`, every `/ui` path asks for one of its
//! tokens: `Authorization: Bearer`, or the cookie the sign-in form sets. Built by
//! `observe::http::serve`; the state arrives through [`UiDeps`].

pub mod events;
pub mod read;
pub mod render;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

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

use crate::replicated::now_ms;
use crate::security::Tokens;
use events::{Hub, Panel};
use read::Source;
use render::{GangFilter, Page};

/// The cookie the sign-in form sets (the token itself, HttpOnly, for `/ui` only).
pub const UI_TOKEN_COOKIE: &str = "gangway_ui_token";
/// Longest token the sign-in form takes, in bytes.
pub const UI_TOKEN_BYTES_MAX: usize = 4096;

/// What the web view needs from the process that serves it.
#[derive(Clone)]
pub struct UiDeps {
    /// Where it reads the cluster.
    pub source: Source,
    /// The accepted client tokens, when the replica requires them.
    pub tokens: Option<Arc<Tokens>>,
}

#[derive(Clone)]
struct UiState {
    source: Source,
    tokens: Option<Arc<Tokens>>,
    hub: Hub,
}

/// The `/ui` routes, announcing changes from `hub`.
pub fn router(deps: UiDeps, hub: Hub) -> Router {
    let state = UiState {
        source: deps.source,
        tokens: deps.tokens,
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
        .route("/ui/assets/{file}", get(asset))
        .with_state(state)
        .merge(guarded)
}

fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == UI_TOKEN_COOKIE)
        .map(|(_, value)| value.to_string())
}

fn bearer_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string())
}

async fn require_token(State(state): State<UiState>, request: Request, next: Next) -> Response {
    let Some(tokens) = &state.tokens else {
        return next.run(request).await;
    };
    let headers = request.headers();
    let presented = bearer_token(headers).or_else(|| cookie_token(headers));
    match presented {
        Some(t) if tokens.accepts(&t) => next.run(request).await,
        presented => {
            let page = request.uri().path().starts_with("/ui/panel")
                || request.uri().path() == "/ui/events";
            let error = presented.map(|_| "token not accepted: sign in again");
            if page {
                (StatusCode::UNAUTHORIZED, error.unwrap_or("sign in first")).into_response()
            } else {
                (
                    StatusCode::UNAUTHORIZED,
                    Html(render::login(error).into_string()),
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

async fn login(State(state): State<UiState>, Form(form): Form<LoginForm>) -> Response {
    let Some(tokens) = &state.tokens else {
        return Redirect::to("/ui").into_response();
    };
    let token = form.token.trim();
    let valid_header = token.len() <= UI_TOKEN_BYTES_MAX
        && !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b';' && b != b',');
    if !valid_header || !tokens.accepts(token) {
        return (
            StatusCode::UNAUTHORIZED,
            Html(render::login(Some("token not accepted")).into_string()),
        )
            .into_response();
    }
    let cookie = format!("{UI_TOKEN_COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict");
    match HeaderValue::from_str(&cookie) {
        Ok(value) => {
            let mut response = Redirect::to("/ui").into_response();
            response.headers_mut().insert(header::SET_COOKIE, value);
            response
        }
        Err(_) => (StatusCode::BAD_REQUEST, "token: not a valid cookie value").into_response(),
    }
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
