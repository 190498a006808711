#pragma once
// Bounds on what a template may cost: templates and their data come from outside (a GGUF, a
// request), so every resource a render may take is capped and exceeding one is a jinja::Error.
#include <cstddef>
#include <cstdint>

namespace fathom::jinja {

struct Limits {
  size_t max_source_bytes = 1 << 20;       // template text (real chat templates: < 32 KiB)
  int max_nesting = 64;                    // parser: nested expressions/blocks (recursion depth)
  int max_call_depth = 32;                 // macro / caller() recursion at render time
  int max_value_depth = 64;                // nesting of lists/dicts walked (printing, tojson, ==)
  uint64_t max_steps = 4'000'000;          // work units: 1 per node and loop step, + 1 per 16
                                           // bytes / 1 per item of every string or list built
  size_t max_output_bytes = 16 << 20;      // rendered text (and any captured block)
  size_t max_string_bytes = 16 << 20;      // one string built by the template
  size_t max_list_items = 1 << 20;         // one list built by the template (range() included)
};

}  // namespace fathom::jinja
