#pragma once
// Optional API keys: "Authorization: Bearer <key>" must name one of the configured keys.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace fathom {

// True when `keys` is empty (auth off) or the header carries one of them. The comparison
// takes the same time wherever the first differing byte is.
bool api_key_accepted(const std::string& authorization_header, const std::vector<std::string>& keys);

// Which of `keys` the header carries (its index), compared as api_key_accepted does; nullopt when
// none (or `keys` is empty).
std::optional<size_t> api_key_index(const std::string& authorization_header, const std::vector<std::string>& keys);

// Keys from a file, one per line (surrounding whitespace trimmed; empty lines and lines starting
// with '#' skipped), so that keys need not appear on the command line (where `ps` shows them).
// Throws fathom::Error when the file cannot be read or holds no key.
std::vector<std::string> read_api_keys_file(const std::string& path);

// Keys from a comma-separated list (the FATHOM_API_KEYS environment variable); empty items skipped.
std::vector<std::string> split_api_keys(const std::string& list);

}  // namespace fathom
