#pragma once
// Options shared by every subcommand that loads a model, and their parsing.
#include <set>
#include <string>

#include "engine/attention/policy.h"
#include "engine/backend/backend_options.h"
#include "server/cli_args.h"

namespace fathom {

// --threads N --kv-dtype f16|f32|int8 --no-transposed-k --precision q8|f32 --block-size N --kv-cache-mib N
// --chat-template F --backend cpu|cuda, and the decode attention policy: --attention dense|sparq|hip|alisa|auto --kv-read-ratio X
// --attention-min-keys N|measured
inline const std::set<std::string> kModelOptionNames = {"model",        "threads",       "kv-dtype",  "precision",
                                                        "block-size",   "kv-cache-mib",  "chat-template",
                                                        "attention",    "kv-read-ratio", "backend",
                                                        "hot-rows-percent", "attention-min-keys"};
inline const std::set<std::string> kModelFlagNames = {"no-transposed-k", "no-pack-weights"};

ModelOptions model_options_from_args(const CliArgs& args, const ModelOptions& defaults = {});
AttentionPolicy attention_from_args(const CliArgs& args, const AttentionPolicy& defaults = {});

}  // namespace fathom
