#pragma once
/// GET /v1/openapi.json: an OpenAPI 3.1 description of the engine's API, generated from the
/// route table (api_routes.h) and the edit-parameter table
/// (protocol/infill_protocol/edit_parameters.h), so it cannot drift from what the engine does.
/// The tests validate it with a real OpenAPI validator (tests/reference/openapi).

#include <nlohmann/json.hpp>

namespace infill {

nlohmann::json openapi_document();

/// The JSON Schema (2020-12, as OpenAPI 3.1 uses) of POST /v1/edits's JSON body.
nlohmann::json edit_parameters_schema();

}  // namespace infill
