// The body of libfathom_spm.so: the only translation unit that includes libsentencepiece's
// header (Debian's copy also declares its own absl::string_view). Built as a MODULE library,
// never linked into fathom_core; see sentencepiece_module.h.
#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/model/sentencepiece_module.h"

namespace {

void set_error(char* err, size_t err_len, const std::string& message) {
  if (err_len == 0) return;
  std::strncpy(err, message.c_str(), err_len - 1);
  err[err_len - 1] = '\0';
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* fathom_spm_load(const char* proto, size_t proto_len, char* err,
                                                             size_t err_len) {
  auto* processor = new sentencepiece::SentencePieceProcessor();
  const auto status = processor->LoadFromSerializedProto(absl::string_view(proto, proto_len));
  if (!status.ok()) {
    set_error(err, err_len, status.ToString());
    delete processor;
    return nullptr;
  }
  return processor;
}

__attribute__((visibility("default"))) int fathom_spm_piece_size(void* processor) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(processor)->GetPieceSize();
}

__attribute__((visibility("default"))) int fathom_spm_encode(void* processor, const char* text, size_t len, int** ids,
                                                             size_t* n, char* err, size_t err_len) {
  std::vector<int> out;
  const auto status =
      static_cast<sentencepiece::SentencePieceProcessor*>(processor)->Encode(absl::string_view(text, len), &out);
  if (!status.ok()) {
    set_error(err, err_len, status.ToString());
    return 1;
  }
  *n = out.size();
  *ids = static_cast<int*>(std::malloc(sizeof(int) * (out.empty() ? 1 : out.size())));
  if (!*ids) {
    set_error(err, err_len, "out of memory");
    return 1;
  }
  std::memcpy(*ids, out.data(), sizeof(int) * out.size());
  return 0;
}

__attribute__((visibility("default"))) void fathom_spm_free(void* p) { std::free(p); }

__attribute__((visibility("default"))) void fathom_spm_destroy(void* processor) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(processor);
}

}  // extern "C"
