//! On a standby JobManager (high availability), every request goes to the leader: the REST
//! API of any JobManager of the cluster answers as the leader's does, so `-m`, Flink's CLI
//! and scripts may name any of them. A request is forwarded at most once (a header marks
//! it); while no leader is elected the answer is 503 with what to do.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::routes::AppState;

/// Where the cluster's leader JobManager is, as this process sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaderRoute {
    /// This process leads: answer here.
    Here,
    /// Another JobManager leads, with this REST address (`host:port`).
    Elsewhere(String),
    /// No leader is known right now.
    Unknown,
}

/// Marks a request a standby already forwarded.
pub const FORWARDED_HEADER: &str = "x-weir-forwarded-by";

/// The largest request body forwarded.
const BODY_BYTES_MAX: usize = 16 << 20;
/// Longest a forwarded request may take.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

fn error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(serde_json::json!({ "errors": [message] }))).into_response()
}

/// The middleware: answers here when this process leads, else forwards to the leader.
pub(crate) async fn route_to_leader(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(lookup) = state.cluster.leader.clone() else {
        return next.run(request).await;
    };
    match lookup() {
        LeaderRoute::Here => next.run(request).await,
        LeaderRoute::Elsewhere(address) if !request.headers().contains_key(FORWARDED_HEADER) => {
            forward(address, request).await
        }
        LeaderRoute::Elsewhere(address) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the JobManager at {address} is not the leader either; a leader election is under way, retry in a few seconds"),
        ),
        LeaderRoute::Unknown => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "no JobManager leads this cluster right now (a leader election is under way, or every JobManager is down); retry in a few seconds".to_string(),
        ),
    }
}

async fn forward(address: String, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, BODY_BYTES_MAX).await else {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request bodies above {BODY_BYTES_MAX} bytes are not forwarded"),
        );
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let url = format!("http://{address}{path}");
    let method = parts.method.clone();
    let content_type = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
    let answer = tokio::task::spawn_blocking(move || {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(FORWARD_TIMEOUT))
            .build()
            .new_agent();
        let mut request =
            ureq::http::Request::builder().method(method.as_str()).uri(&url).header(FORWARDED_HEADER, "standby");
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let request = request.body(bytes.to_vec()).map_err(|e| e.to_string())?;
        let mut response = agent.run(request).map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_string);
        let body = response.body_mut().read_to_vec().map_err(|e| e.to_string())?;
        Ok::<_, String>((status, content_type, body))
    })
    .await;
    match answer {
        Ok(Ok((status, content_type, body))) => {
            let mut response = Response::new(Body::from(body));
            *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            if let Some(value) = content_type.and_then(|c| HeaderValue::from_str(&c).ok()) {
                response.headers_mut().insert(header::CONTENT_TYPE, value);
            }
            response
        }
        // 503 as Flink's REST endpoints answer during a leader election: clients (weir's CLI
        // and Flink's, with rest.retry.*) try again, where a 502 would end them.
        Ok(Err(reason)) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the leader JobManager at {address} did not answer ({reason}); it may be failing over, retry in a few seconds"
            ),
        ),
        Err(join) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("forwarding to the leader failed: {join}")),
    }
}
