//! The HTTP face of the API server double: Kubernetes REST paths for the kinds in
//! [`crate::store::KINDS`] (list, watch, get, create, update, merge patch, delete, the
//! `status` subresource and `pods/binding`), Status bodies for errors, and chunked
//! watch streams with bookmarks and 410 Gone. Called by [`crate::ApiServerDouble`].

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::store::{kind_at, merge_patch, ApiError, EventType, Kind, Selector, PODS};
use crate::{claim_controller, Shared};

/// Events buffered per watch before the stream pushes back on the producer.
pub const WATCH_BUFFER_EVENTS: usize = 1024;
/// Period of bookmark events on an idle watch that asked for them, in ms.
pub const BOOKMARK_INTERVAL_MS: u64 = 1_000;
/// Longest watch when the client names no timeoutSeconds, in s.
pub const WATCH_TIMEOUT_S_DEFAULT: u64 = 1_800;

/// A parsed request path.
#[derive(Debug)]
struct Target {
    kind: Kind,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn parse_path(path: &str) -> Result<Target, ApiError> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(not_served(path)),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (plural, name, subresource) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(name.to_string()), None),
        [plural, name, sub] => (*plural, Some(name.to_string()), Some(sub.to_string())),
        _ => return Err(not_served(path)),
    };
    let kind = kind_at(group, version, plural).ok_or_else(|| not_served(path))?;
    if namespace.is_some() && !kind.namespaced {
        return Err(not_served(path));
    }
    Ok(Target {
        kind,
        namespace,
        name,
        subresource,
    })
}

fn not_served(path: &str) -> ApiError {
    ApiError {
        code: 404,
        reason: "NotFound",
        message: format!("the server could not find the requested resource ({path})"),
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_params(uri: &Uri) -> Vec<(String, String)> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

fn param<'a>(params: &'a [(String, String)], key: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn error_response(e: &ApiError) -> Response {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(code, &e.status())
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("body: {e}")))
}

/// Serves one request.
pub async fn handle(
    shared: Arc<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if uri.path() == "/version" {
        return json_response(
            StatusCode::OK,
            &json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-gangway-double"}),
        );
    }
    let target = match parse_path(uri.path()) {
        Ok(t) => t,
        Err(e) => return error_response(&e),
    };
    let params = query_params(&uri);
    let watch = matches!(param(&params, "watch"), Some("true" | "1"));
    let result = match (&method, &target.name, watch) {
        (&Method::GET, None, true) => return watch_response(shared, target, &params),
        (&Method::GET, None, false) => list(&shared, &target, &params),
        (&Method::GET, Some(_), _) => get(&shared, &target),
        (&Method::POST, None, _) => create(&shared, &target, &body),
        (&Method::POST, Some(_), _) if target.subresource.as_deref() == Some("binding") => {
            bind(&shared, &target, &body)
        }
        (&Method::PUT, Some(_), _) => replace(&shared, &target, &body),
        (&Method::PATCH, Some(_), _) => patch(&shared, &target, &headers, &body),
        (&Method::DELETE, Some(_), _) => delete(&shared, &target, &body),
        _ => Err(ApiError {
            code: 405,
            reason: "MethodNotAllowed",
            message: format!("{method} is not supported on {}", uri.path()),
        }),
    };
    match result {
        Ok((code, value)) => json_response(code, &value),
        Err(e) => error_response(&e),
    }
}

type Reply = Result<(StatusCode, Value), ApiError>;

fn list(shared: &Shared, target: &Target, params: &[(String, String)]) -> Reply {
    let selector = Selector::parse(
        target.namespace.clone(),
        param(params, "fieldSelector"),
        param(params, "labelSelector"),
    )?;
    let (items, rv) = shared.store().list(&target.kind, &selector);
    Ok((
        StatusCode::OK,
        json!({
            "apiVersion": target.kind.api_version(),
            "kind": format!("{}List", target.kind.kind),
            "metadata": {"resourceVersion": rv.to_string()},
            "items": items,
        }),
    ))
}

fn get(shared: &Shared, target: &Target) -> Reply {
    let name = target.name.as_deref().unwrap_or_default();
    let object = shared
        .store()
        .get(&target.kind, target.namespace.as_deref(), name)?;
    Ok((StatusCode::OK, object))
}

fn create(shared: &Shared, target: &Target, body: &Bytes) -> Reply {
    let object = parse_body(body)?;
    let created = shared.write(|store| {
        let created = store.create(&target.kind, target.namespace.as_deref(), object)?;
        if target.kind == PODS && shared.options.claim_controller {
            claim_controller::pod_created(store, &created);
        }
        Ok(created)
    })?;
    Ok((StatusCode::CREATED, created))
}

fn bind(shared: &Shared, target: &Target, body: &Bytes) -> Reply {
    if target.kind != PODS {
        return Err(ApiError::bad_request("binding is a pods subresource"));
    }
    if shared.bindings_unavailable() {
        return Err(ApiError::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        ));
    }
    let binding = parse_body(body)?;
    let name = target.name.as_deref().unwrap_or_default();
    let node = binding["target"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request("target.name: Required value"))?
        .to_string();
    let precondition = binding["metadata"]["uid"].as_str().map(String::from);
    shared.write(|store| {
        store.update(&PODS, target.namespace.as_deref(), name, None, |pod| {
            let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
            if let Some(want) = precondition.as_deref().filter(|u| !u.is_empty()) {
                if want != uid {
                    return Err(ApiError::conflict(format!(
                        "Operation cannot be fulfilled on pods/binding \"{name}\": Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
                    )));
                }
            }
            if let Some(current) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
                return Err(ApiError::conflict(format!(
                    "Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{current}\""
                )));
            }
            pod["spec"]["nodeName"] = json!(node);
            set_condition(pod, "PodScheduled", "True");
            Ok(())
        })
    })?;
    shared.record_binding(crate::Binding {
        namespace: target.namespace.clone().unwrap_or_default(),
        pod: name.to_string(),
        node,
        revision: shared.store().revision(),
    });
    Ok((
        StatusCode::CREATED,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

fn set_condition(pod: &mut Value, kind: &str, status: &str) {
    let conditions = &mut pod["status"]["conditions"];
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    if let Some(list) = conditions.as_array_mut() {
        list.retain(|c| c["type"].as_str() != Some(kind));
        list.push(json!({"type": kind, "status": status}));
    }
}

/// The part of `next` an update through `subresource` may change, laid over `current`.
fn scoped(kind: &Kind, subresource: Option<&str>, current: &Value, mut next: Value) -> Value {
    match subresource {
        Some("status") => {
            let mut out = current.clone();
            out["status"] = next["status"].take();
            out
        }
        _ if kind.status_subresource => {
            next["status"] = current["status"].clone();
            if next["status"].is_null() {
                if let Some(map) = next.as_object_mut() {
                    map.remove("status");
                }
            }
            next
        }
        _ => next,
    }
}

fn check_subresource(target: &Target) -> Result<(), ApiError> {
    match target.subresource.as_deref() {
        None => Ok(()),
        Some("status") if target.kind.status_subresource => Ok(()),
        Some(other) => Err(ApiError::bad_request(format!(
            "subresource {other:?} is not served for {}",
            target.kind.plural
        ))),
    }
}

fn replace(shared: &Shared, target: &Target, body: &Bytes) -> Reply {
    check_subresource(target)?;
    let object = parse_body(body)?;
    write_scoped(shared, target, &object, |_| object.clone())
}

/// Stores what `next` makes of the current object, limited to what the target's
/// subresource may change; a resourceVersion in `sent` must match the stored one.
fn write_scoped(
    shared: &Shared,
    target: &Target,
    sent: &Value,
    next: impl Fn(&Value) -> Value,
) -> Reply {
    let expected = sent["metadata"]["resourceVersion"]
        .as_str()
        .map(String::from);
    let name = target.name.as_deref().unwrap_or_default();
    let updated = shared.write(|store| {
        store.update(
            &target.kind,
            target.namespace.as_deref(),
            name,
            expected.as_deref(),
            |current| {
                *current = scoped(
                    &target.kind,
                    target.subresource.as_deref(),
                    current,
                    next(current),
                );
                Ok(())
            },
        )
    })?;
    Ok((StatusCode::OK, updated))
}

fn patch(shared: &Shared, target: &Target, headers: &HeaderMap, body: &Bytes) -> Reply {
    check_subresource(target)?;
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/merge-patch+json")
        && !content_type.starts_with("application/strategic-merge-patch+json")
    {
        return Err(ApiError {
            code: 415,
            reason: "UnsupportedMediaType",
            message: format!(
                "the body of the request was in an unknown format ({content_type}); this test server accepts merge patches"
            ),
        });
    }
    let patch = parse_body(body)?;
    write_scoped(shared, target, &patch, |current| {
        let mut next = current.clone();
        merge_patch(&mut next, &patch);
        next
    })
}

fn delete(shared: &Shared, target: &Target, body: &Bytes) -> Reply {
    let options = parse_body(body)?;
    let uid = options["preconditions"]["uid"].as_str().map(String::from);
    let rv = options["preconditions"]["resourceVersion"]
        .as_str()
        .map(String::from);
    let name = target.name.as_deref().unwrap_or_default();
    let gone = shared.write(|store| {
        let gone = store.delete(
            &target.kind,
            target.namespace.as_deref(),
            name,
            uid.as_deref(),
            rv.as_deref(),
        )?;
        if target.kind == PODS && shared.options.claim_controller {
            claim_controller::pod_deleted(store, &gone);
        }
        // Recorded before the delete is visible, so a reader that sees the object gone
        // finds it in the log.
        shared.record_deletion(gone.clone());
        Ok(gone)
    })?;
    Ok((StatusCode::OK, gone))
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut text = json!({"type": kind, "object": object}).to_string();
    text.push('\n');
    Bytes::from(text)
}

fn bookmark(kind: &Kind, rv: u64) -> Bytes {
    line(
        "BOOKMARK",
        &json!({"kind": kind.kind, "apiVersion": kind.api_version(), "metadata": {"resourceVersion": rv.to_string()}}),
    )
}

fn watch_response(shared: Arc<Shared>, target: Target, params: &[(String, String)]) -> Response {
    let selector = match Selector::parse(
        target.namespace.clone(),
        param(params, "fieldSelector"),
        param(params, "labelSelector"),
    ) {
        Ok(s) => s,
        Err(e) => return error_response(&e),
    };
    let since = param(params, "resourceVersion")
        .filter(|v| !v.is_empty() && *v != "0")
        .map(|v| v.parse::<u64>());
    let since = match since {
        Some(Ok(rv)) => Some(rv),
        Some(Err(_)) => {
            return error_response(&ApiError::bad_request("resourceVersion: not a number"))
        }
        None => None,
    };
    let bookmarks = matches!(param(params, "allowWatchBookmarks"), Some("true" | "1"));
    let timeout_s = param(params, "timeoutSeconds")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(WATCH_TIMEOUT_S_DEFAULT);
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(WATCH_BUFFER_EVENTS);
    let kind = target.kind;
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout_s);
        stream_changes(&shared, kind, selector, since, bookmarks, deadline, tx).await;
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn stream_changes(
    shared: &Shared,
    kind: Kind,
    selector: Selector,
    since: Option<u64>,
    bookmarks: bool,
    deadline: tokio::time::Instant,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    let mut revisions = shared.revisions.subscribe();
    let mut cursor = match since {
        Some(rv) => rv,
        None => {
            // No resourceVersion: the current state as ADDED events, then changes.
            let (items, rv) = shared.store().list(&kind, &selector);
            for item in items {
                if tx.send(Ok(line("ADDED", &item))).await.is_err() {
                    return;
                }
            }
            rv
        }
    };
    loop {
        let read = {
            let store = shared.store();
            store
                .changes_since(&kind, cursor, &Selector::default())
                .map(|changes| (changes, store.revision()))
        };
        match read {
            Err(e) => {
                let _ = tx.send(Ok(line("ERROR", &e.status()))).await;
                return;
            }
            Ok((changes, revision)) => {
                for change in changes {
                    if let Some(event) = shared.visible(&kind, &selector, &change) {
                        if tx
                            .send(Ok(line(event.as_str(), &change.object)))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
                cursor = revision;
            }
        }
        tokio::select! {
            changed = revisions.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(Duration::from_millis(BOOKMARK_INTERVAL_MS)) => {
                if bookmarks && tx.send(Ok(bookmark(&kind, cursor))).await.is_err() {
                    return;
                }
            }
            _ = tokio::time::sleep_until(deadline) => return,
            _ = tx.closed() => return,
        }
    }
}

impl Shared {
    /// How a watcher with `selector` sees `change`: objects moving out of the selection
    /// are DELETED, moving in are ADDED, as the real server's watch cache does.
    fn visible(
        &self,
        _kind: &Kind,
        selector: &Selector,
        change: &crate::store::Change,
    ) -> Option<EventType> {
        let now = selector.matches(&change.object);
        let before = change
            .previous
            .as_ref()
            .is_some_and(|p| selector.matches(p));
        match (change.kind, before, now) {
            (EventType::Deleted, _, true) => Some(EventType::Deleted),
            (EventType::Deleted, _, false) => None,
            (_, true, true) => Some(change.kind),
            (_, false, true) => Some(EventType::Added),
            (_, true, false) => Some(EventType::Deleted),
            (_, false, false) => None,
        }
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
