#pragma once
// The fields each OpenAI-style endpoint understands. An unknown field is a 400 naming it, as
// OpenAI answers an unrecognised argument: a client that sends llama.cpp's or vLLM's spelling of a
// feature fathom lacks, or a typo, learns it at once instead of getting unconstrained output.
// `http.unknown_fields: ignore` turns the check off (server/config.h).
#include <string>

#include <nlohmann/json.hpp>

#include "server/openai_request.h"

namespace fathom {

struct ServerConfig;

// Throws ApiError(400, code "unknown_parameter") naming the first field of `body` that `kind`'s
// endpoint does not define: OpenAI's fields (some accepted as no-ops: `store`, `metadata`,
// `service_tier`), fathom's extensions, and peers' aliases of features fathom has.
void check_known_fields(const nlohmann::json& body, ApiKind kind, const ServerConfig& config);

}  // namespace fathom
