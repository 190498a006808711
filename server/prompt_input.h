#pragma once
// Turning CLI prompt options into token ids: --prompt TEXT, --chat JSON, --prompt-ids 1,2,3.
#include <cstdint>
#include <string>
#include <vector>

#include "server/cli_args.h"

namespace fathom {

class Model;

// Every prompt given, in the order: --prompt..., --chat..., --prompt-ids...
// Throws fathom::Error when there is none or one is malformed.
std::vector<std::vector<int32_t>> prompts_from_args(const Model& model, const CliArgs& args);
std::vector<int32_t> parse_id_list(const std::string& text);
// --chat accepts a JSON array of {"role", "content"} objects.
std::vector<int32_t> encode_chat_json(const Model& model, const std::string& json_text);

}  // namespace fathom
