//! Errors: [`RestError`] for starting the server, and the HTTP error answers of the routes.

use std::io;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::responses::ErrorResponse;

/// Why the REST API could not start.
#[derive(Debug, thiserror::Error)]
pub enum RestError {
    /// The listening socket could not be bound.
    #[error("cannot bind the REST API to {address}: {}", bind_advice(.error))]
    Bind {
        /// The address as configured, `host:port`.
        address: String,
        /// What the operating system said.
        error: io::Error,
    },
    /// The server's runtime or thread could not be started.
    #[error("cannot start the REST API: {0}")]
    Start(io::Error),
}

/// What went wrong binding, and what to do about it.
fn bind_advice(error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::AddrInUse => "address in use; is another weir or Flink running? \
             set -D rest.port=0 for any free port or choose another port"
            .to_string(),
        io::ErrorKind::PermissionDenied => "permission denied; ports below 1024 need \
             privileges: choose another port with -D rest.port=<port> (0 for any free port)"
            .to_string(),
        io::ErrorKind::AddrNotAvailable => "the address is not one of this machine's; \
             set -D rest.address to a local address such as 127.0.0.1 or 0.0.0.0"
            .to_string(),
        _ => format!("{error}; check -D rest.address and -D rest.port"),
    }
}

/// `host:port`, with IPv6 hosts in brackets.
pub(crate) fn display_address(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// An error answer: a status and one message, sent as `{"errors":[message]}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into() }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = %self.status, error = %self.message, "REST request failed");
        } else {
            tracing::debug!(status = %self.status, error = %self.message, "REST request refused");
        }
        let body = ErrorResponse { errors: vec![self.message] };
        (self.status, Json(body)).into_response()
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> ApiError {
        ApiError::bad_request(rejection.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> ApiError {
        ApiError::bad_request(rejection.body_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_errors_name_the_address_and_the_fix() {
        let error = RestError::Bind {
            address: display_address("127.0.0.1", 8081),
            error: io::Error::from(io::ErrorKind::AddrInUse),
        };
        assert_eq!(
            error.to_string(),
            "cannot bind the REST API to 127.0.0.1:8081: address in use; is another weir or \
             Flink running? set -D rest.port=0 for any free port or choose another port"
        );
        assert_eq!(display_address("::1", 80), "[::1]:80");
    }
}
