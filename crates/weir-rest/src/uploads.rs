//! What Flink's clients upload, which weir cannot run: `flink run`'s JobGraph and jars
//! (`POST /jobs` as multipart/form-data) and the dashboard's and scripts' jar uploads
//! (`POST /jars/upload`, `/jars/{jarid}/run`).
//!
//! weir runs the jobs compiled into its binary. A refusal is only useful if the client
//! reads it: an answer sent before the upload was read, followed by a close, reaches Flink's
//! client as "Channel became inactive", retried for over a minute. So the upload is read to
//! its end (and dropped) before the 400 goes out.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use futures::StreamExt as _;

use crate::error::ApiError;

/// The most of a refused upload that is read before the connection is given up (a large
/// job's jars are a few hundred MB).
const DRAIN_MAX_BYTES: u64 = 1 << 30;

/// What to do instead of uploading a Flink program.
pub(crate) const RUN_CATALOG_JOBS: &str = "weir runs the jobs compiled into its binary, not a Flink JobGraph or jar: `weir jobs` lists them, and `weir run -m HOST:PORT JOB [ARGS]` (or POST /jobs with a JSON body {\"job\": NAME, \"args\": [...]}) submits one; your own jobs go into your own binary (weir_cli::main_with)";

/// Whether the request carries a multipart upload (Flink's `RestClusterClient` sends the
/// JobGraph and its jars so).
pub(crate) fn is_multipart(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("multipart/"))
}

/// Reads `body` to its end (up to [`DRAIN_MAX_BYTES`]) and drops it, so the answer that
/// follows reaches a client still sending.
pub(crate) async fn drain(body: Body) {
    let mut stream = body.into_data_stream();
    let mut read = 0u64;
    while let Some(Ok(chunk)) = stream.next().await {
        read += chunk.len() as u64;
        if read > DRAIN_MAX_BYTES {
            break;
        }
    }
}

/// A multipart `POST /jobs`, read and refused.
pub(crate) async fn refuse_program_upload(body: Body) -> ApiError {
    drain(body).await;
    ApiError::bad_request(RUN_CATALOG_JOBS.to_string())
}

/// `POST /jars/upload`: Flink's jar upload (the dashboard's "Submit New Job", scripts).
/// weir has no jar store, so the answer is 404, with what to do instead.
#[utoipa::path(post, path = "/jars/upload", tag = "jobs", summary = "Flink's jar upload: read, then 404 (weir has no jars: it runs the jobs compiled into its binary)", responses((status = 404, description = "weir has no jars; the message says what to do instead", body = crate::responses::ErrorResponse)))]
pub(crate) async fn upload_jar(body: Body) -> ApiError {
    drain(body).await;
    ApiError::new(StatusCode::NOT_FOUND, RUN_CATALOG_JOBS.to_string())
}

/// `POST /jars/{jarid}/run`: no jar was ever uploaded, so there is none of that id (404).
#[utoipa::path(post, path = "/jars/{jarid}/run", tag = "jobs", summary = "Flink's run of an uploaded jar: 404 (weir has no jars: it runs the jobs compiled into its binary)", params(("jarid" = String, Path, description = "The id Flink's upload would have given")), responses((status = 404, description = "weir has no jars; the message says what to do instead", body = crate::responses::ErrorResponse)))]
pub(crate) async fn run_jar(body: Body) -> ApiError {
    drain(body).await;
    ApiError::new(StatusCode::NOT_FOUND, RUN_CATALOG_JOBS.to_string())
}

#[cfg(test)]
mod tests {
    use super::is_multipart;
    use axum::http::{HeaderMap, HeaderValue, header};

    #[test]
    fn a_multipart_upload_is_told_from_a_json_submission() {
        let mut headers = HeaderMap::new();
        assert!(!is_multipart(&headers));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        assert!(!is_multipart(&headers));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("Multipart/Form-Data; boundary=x"));
        assert!(is_multipart(&headers));
    }
}
