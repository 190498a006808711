#pragma once
// Optional API keys: "Authorization: Bearer <key>" must name one of the configured keys.
#include <string>
#include <vector>

namespace fathom {

// True when `keys` is empty (auth off) or the header carries one of them. The comparison
// takes the same time wherever the first differing byte is.
bool api_key_accepted(const std::string& authorization_header, const std::vector<std::string>& keys);

}  // namespace fathom
