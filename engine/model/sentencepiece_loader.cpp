// Loads libfathom_spm.so once per process and forwards to it (see sentencepiece_module.h).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "base/error.h"
#include "engine/model/sentencepiece_module.h"

// AddressSanitizer aborts a process that dlopen()s with RTLD_DEEPBIND (google/sanitizers#611): the
// fuzzers' builds refuse the module instead, as a load error they expect.
#if defined(__SANITIZE_ADDRESS__)
#define FATHOM_SPM_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FATHOM_SPM_UNDER_ASAN 1
#endif
#endif

#ifndef FATHOM_SPM_MODULE_PATH
#define FATHOM_SPM_MODULE_PATH "libfathom_spm.so"
#endif

namespace fathom {

struct SentencePieceModule::Api {
  decltype(&fathom_spm_load) load;
  decltype(&fathom_spm_piece_size) piece_size;
  decltype(&fathom_spm_encode) encode;
  decltype(&fathom_spm_free) free;
  decltype(&fathom_spm_destroy) destroy;
};

namespace {

// Candidates: $FATHOM_SPM_MODULE, beside the executable, the build tree's path.
std::vector<std::string> module_candidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("FATHOM_SPM_MODULE")) paths.push_back(env);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) paths.push_back((exe.parent_path() / "libfathom_spm.so").string());
  paths.push_back(FATHOM_SPM_MODULE_PATH);
  return paths;
}

const SentencePieceModule::Api* load_api() {
  static std::once_flag once;
  static SentencePieceModule::Api api{};
  static std::string failure;
  std::call_once(once, [] {
#ifdef FATHOM_SPM_UNDER_ASAN
    failure = "not loaded under AddressSanitizer, which cannot dlopen it with RTLD_DEEPBIND";
    return;
#endif
    void* handle = nullptr;
    for (const std::string& path : module_candidates()) {
      handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (handle) break;
      failure = dlerror();
    }
    if (!handle) return;
    auto sym = [&](const char* name) { return dlsym(handle, name); };
    api.load = reinterpret_cast<decltype(api.load)>(sym("fathom_spm_load"));
    api.piece_size = reinterpret_cast<decltype(api.piece_size)>(sym("fathom_spm_piece_size"));
    api.encode = reinterpret_cast<decltype(api.encode)>(sym("fathom_spm_encode"));
    api.free = reinterpret_cast<decltype(api.free)>(sym("fathom_spm_free"));
    api.destroy = reinterpret_cast<decltype(api.destroy)>(sym("fathom_spm_destroy"));
    if (!api.load || !api.piece_size || !api.encode || !api.free || !api.destroy) {
      failure = "libfathom_spm.so lacks its entry points";
      api.load = nullptr;
    }
  });
  if (!api.load) throw Error("cannot load the sentencepiece module: " + failure);
  return &api;
}

}  // namespace

SentencePieceModule::SentencePieceModule(const std::string& proto) : api_(load_api()) {
  char err[512] = {0};
  processor_ = api_->load(proto.data(), proto.size(), err, sizeof(err));
  if (!processor_) throw Error(std::string("sentencepiece rejected the vocabulary: ") + err);
}

SentencePieceModule::~SentencePieceModule() {
  if (processor_) api_->destroy(processor_);
}

int SentencePieceModule::piece_size() const { return api_->piece_size(processor_); }

std::vector<int> SentencePieceModule::encode(std::string_view text) const {
  char err[512] = {0};
  int* ids = nullptr;
  size_t n = 0;
  if (api_->encode(processor_, text.data(), text.size(), &ids, &n, err, sizeof(err)) != 0)
    throw Error(std::string("sentencepiece encode failed: ") + err);
  std::vector<int> out(ids, ids + n);
  api_->free(ids);
  return out;
}

}  // namespace fathom
