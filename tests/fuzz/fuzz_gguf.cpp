// libFuzzer target for the GGUF reader: parse an arbitrary image, then use everything the
// parser returned. fathom::Error is the expected outcome for bad input; any other exception,
// crash, sanitizer report, leak or hang is a bug.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/model/gguf.h"

namespace {

template <class Fn>
void expect_value_or_error(Fn&& fn) {
  try {
    fn();
  } catch (const fathom::Error&) {
    // a type mismatch or out-of-range value: fine
  }
}

template <class T>
size_t size_of(const std::optional<std::vector<T>>& v) {
  return v ? v->size() : 0;
}

// Every getter on every key: each either returns a value or throws fathom::Error.
void exercise_metadata(const fathom::GgufFile& f) {
  volatile size_t sink = 0;
  for (const auto& entry : f.metadata()) {
    const std::string& key = entry.first;
    if (f.find(key) != &entry.second) __builtin_trap();
    expect_value_or_error([&] { sink = sink + static_cast<size_t>(f.get_int(key).value_or(0)); });
    expect_value_or_error([&] { sink = sink + static_cast<size_t>(f.get_float(key).value_or(0) != 0); });
    expect_value_or_error([&] { sink = sink + f.get_bool(key).value_or(false); });
    expect_value_or_error([&] { sink = sink + f.get_string(key).value_or("").size(); });
    expect_value_or_error([&] { sink = sink + size_of(f.get_string_array(key)); });
    expect_value_or_error([&] { sink = sink + size_of(f.get_float_array(key)); });
    expect_value_or_error([&] { sink = sink + size_of(f.get_int_array(key)); });
    expect_value_or_error([&] { sink = sink + static_cast<size_t>(f.require_int(key)); });
  }
}

// Touches the first and last byte of every tensor so ASan checks the bounds the parser
// promised, and checks the derived sizes agree.
void exercise_tensors(const fathom::GgufFile& f, const uint8_t* data, size_t size) {
  volatile uint8_t sink = 0;
  for (const auto& t : f.tensors()) {
    if (f.find_tensor(t.name) != &t) __builtin_trap();
    if (t.dims.empty() || t.dims.size() > 4 || t.elements() < 0 || t.rows() < 0) __builtin_trap();
    if (t.nbytes == 0) continue;
    if (t.data < data || t.data + t.nbytes > data + size) __builtin_trap();
    sink = sink + t.data[0] + t.data[t.nbytes - 1];
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<fathom::GgufFile> f;
  try {
    f = fathom::GgufFile::parse(data, size, "fuzz");
  } catch (const fathom::Error& e) {
    const std::string msg = e.what();
    if (msg.rfind("fuzz: ", 0) != 0 || msg.find('\n') != std::string::npos) __builtin_trap();
    return 0;
  }
  exercise_metadata(*f);
  exercise_tensors(*f, data, size);
  return 0;
}
