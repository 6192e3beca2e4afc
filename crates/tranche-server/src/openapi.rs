//! The API's OpenAPI document, generated from the handlers' own descriptions (`utoipa`), and
//! served at `/openapi.json`.

use axum::Json;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::error::{ErrorBody, ErrorDetail};
use crate::jobs::{Accepted, JsonJob};
use crate::review::RejectBody;
use crate::settings::ApiSettings;

#[derive(OpenApi)]
#[openapi(
    info(title = "tranche", description = "A durable pipeline for LLM batch APIs: jobs in, results out."),
    paths(
        crate::jobs::submit, crate::jobs::list, crate::jobs::show, crate::jobs::cancel,
        crate::jobs::results, crate::jobs::cost, crate::events::events, crate::review::show,
        crate::review::approve, crate::review::reject, crate::files::audit,
        crate::health::healthz, crate::health::readyz, crate::metrics::metrics,
    ),
    components(schemas(Accepted, JsonJob, ApiSettings, RejectBody, ErrorBody, ErrorDetail)),
    modifiers(&BearerTokens)
)]
struct ApiDoc;

/// Every `/v1` call carries a tenant's bearer token.
struct BearerTokens;

impl Modify for BearerTokens {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let scheme =
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build());
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("bearer", scheme);
    }
}

/// The document, as generated.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// `GET /openapi.json`.
pub async fn serve() -> Response {
    Json(document()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_describes_every_route_and_how_it_is_authorized() {
        let doc = serde_json::to_value(document()).unwrap();
        let paths: Vec<&str> =
            doc["paths"].as_object().unwrap().keys().map(String::as_str).collect();
        let expected = [
            "/healthz",
            "/metrics",
            "/readyz",
            "/v1/files/audit",
            "/v1/jobs",
            "/v1/jobs/{id}",
            "/v1/jobs/{id}/approve",
            "/v1/jobs/{id}/cancel",
            "/v1/jobs/{id}/cost",
            "/v1/jobs/{id}/events",
            "/v1/jobs/{id}/reject",
            "/v1/jobs/{id}/results",
            "/v1/jobs/{id}/review",
        ];
        assert_eq!(paths, expected);
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                let secured = operation.get("security").is_some();
                assert_eq!(secured, path.starts_with("/v1"), "{method} {path}");
            }
        }
        assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
        let settings = &doc["components"]["schemas"]["ApiSettings"]["properties"];
        for name in ["task", "provider", "schema", "budget", "cache_shared_prompt"] {
            assert!(settings.get(name).is_some(), "settings.{name}");
        }
        assert!(settings.get("tenant").is_none(), "the tenant is the caller's");
    }
}
