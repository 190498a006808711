#pragma once
// libsentencepiece behind a dlopen()ed module (libfathom_spm.so).
//
// Why: Debian's libsentencepiece.so.0 carries and exports its own protobuf-lite 3.14, while gRPC
// needs the system libprotobuf 3.21. Linked into one process the two copies interpose and the
// process crashes before main. Loaded with RTLD_LOCAL | RTLD_DEEPBIND, the module and its
// sentencepiece resolve their own symbols first and never meet the server's protobuf.
// The module exports the small C interface below; SentencePieceModule wraps it.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

extern "C" {
// Returns a processor handle, or nullptr with a message in err.
void* fathom_spm_load(const char* proto, size_t proto_len, char* err, size_t err_len);
int fathom_spm_piece_size(void* processor);
// Writes the ids to *ids (malloc'ed; free with fathom_spm_free); 0 on success, else err is set.
int fathom_spm_encode(void* processor, const char* text, size_t len, int** ids, size_t* n, char* err, size_t err_len);
void fathom_spm_free(void* p);
void fathom_spm_destroy(void* processor);
}

namespace fathom {

// One loaded sentencepiece model. Throws fathom::Error when the module or the model cannot load.
class SentencePieceModule {
 public:
  explicit SentencePieceModule(const std::string& serialized_proto);
  ~SentencePieceModule();
  SentencePieceModule(const SentencePieceModule&) = delete;
  SentencePieceModule& operator=(const SentencePieceModule&) = delete;

  int piece_size() const;
  std::vector<int> encode(std::string_view text) const;

  struct Api;  // the module's entry points (defined in sentencepiece_loader.cpp)

 private:
  const Api* api_;
  void* processor_ = nullptr;
};

}  // namespace fathom
