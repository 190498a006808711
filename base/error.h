#pragma once
// Errors: fathom::Error for bad input (a one-line message meant for the user),
// FATHOM_CHECK for internal invariants (names the failed statement, file and line).
#include <stdexcept>
#include <string>

namespace fathom {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace fathom

#define FATHOM_CHECK(cond, ...)                                                        \
  do {                                                                                 \
    if (!(cond)) ::fathom::check_failed(#cond, __FILE__, __LINE__, std::string{__VA_ARGS__}); \
  } while (0)
