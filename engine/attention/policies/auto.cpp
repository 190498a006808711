#include "engine/attention/policies/auto.h"

namespace fathom::auto_policy {
namespace {

AttentionPolicy resolve(const AttentionPolicy& p) {
  static const PolicyKind alisa = policy_kind("alisa");
  AttentionPolicy chosen = p;
  chosen.kind = alisa;
  return chosen;
}

}  // namespace

// Groupable: a request on auto may join a bifurcated group (which reads densely, once per
// shared prefix).
const PolicyDef kDef{.name = "auto", .resolve = resolve, .groupable = true};

}  // namespace fathom::auto_policy
