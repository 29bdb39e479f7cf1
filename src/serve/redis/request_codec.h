// A ServeRequest as the JSON stored in the job hash, so that a worker process runs exactly what the gateway
// accepted (the init image travels as a lossless PNG).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "serve/serve_request.h"

namespace atelier::serve::redis {

nlohmann::json encode_request(const ServeRequest& r);
// Errors name the field that is missing or has the wrong type.
Expected<ServeRequest> decode_request(const std::string& json_text);

}  // namespace atelier::serve::redis
