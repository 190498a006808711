#pragma once
// The one error type of the Jinja interpreter: syntax errors (with the template line), runtime
// errors (undefined attribute, type errors, a limit reached) and raise_exception(msg).
#include <string>

#include "base/error.h"

namespace fathom::jinja {

class Error : public fathom::Error {
 public:
  // line: 1-based template line, 0 when unknown.
  Error(const std::string& msg, int line = 0)
      : fathom::Error(line > 0 ? msg + " (template line " + std::to_string(line) + ")" : msg),
        message_(msg), line_(line) {}
  const std::string& message() const { return message_; }  // without the line suffix
  int line() const { return line_; }

 private:
  std::string message_;
  int line_;
};

}  // namespace fathom::jinja
