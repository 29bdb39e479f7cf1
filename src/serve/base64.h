// Base64 (RFC 4648, standard alphabet) for images in JSON bodies. Decoding is strict about the alphabet and
// padding but, like the clients that send it, tolerates a "data:<mime>;base64," prefix and line breaks.
#pragma once
#include <string>
#include <string_view>

#include "core/status.h"

namespace atelier::serve {

std::string base64_encode(std::string_view bytes);
// `field` names the JSON field in error messages. Input longer than max_decoded_bytes * 4/3 is refused
// before any decoding.
Expected<std::string> base64_decode(std::string_view text, const std::string& field, size_t max_decoded_bytes);

}  // namespace atelier::serve
