#include "base/error.h"

namespace fathom {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::string text = std::string("internal check failed: ") + expr + " at " + file + ":" + std::to_string(line);
  if (!msg.empty()) text += ": " + msg;
  throw std::logic_error(text);
}

}  // namespace fathom
