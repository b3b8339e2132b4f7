//! The Web UI: three static files compiled into the binary (no separate build, nothing to
//! install), served at `/`. The page is a small script that renders the REST API's JSON.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

const INDEX_HTML: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
const APP_CSS: &str = include_str!("../ui/app.css");

/// Every response is revalidated, so an upgraded JobManager never serves a stale script.
const NO_CACHE: (header::HeaderName, &str) = (header::CACHE_CONTROL, "no-cache");

async fn index() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), NO_CACHE], INDEX_HTML)
}

async fn app_js() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8"), NO_CACHE], APP_JS)
}

async fn app_css() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8"), NO_CACHE], APP_CSS)
}

/// The UI's routes: `/` and `/index.html`, `/app.js`, `/app.css`.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/index.html", get(index))
        .route("/app.js", get(app_js))
        .route("/app.css", get(app_css))
}
