// dump_tensor MODEL.gguf TENSOR_NAME OUT.f32 [--cpu]
// Dequantizes a whole tensor from a GGUF file and writes it as raw little-endian float32,
// rows in file order (dims[0] contiguous). Uses ref::dequantize_row, or the SIMD
// cpu::dequantize_row with --cpu. Used by tests/e2e/test_dequant_vs_gguf.py.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/model/gguf.h"
#include "engine/model/hf_dir.h"
#include "kernels/cpu/matmul.h"
#include "kernels/ref/dequant.h"

namespace {

int usage() {
  std::fprintf(stderr, "usage: dump_tensor MODEL.gguf|MODEL_DIR TENSOR_NAME OUT.f32 [--cpu]\n");
  return 2;
}

int run(const std::string& model, const std::string& name, const std::string& out, bool use_cpu) {
  using namespace fathom;
  const auto file = open_model_file(model);  // a GGUF file or a Hugging Face directory (GGUF tensor names)
  const GgufTensorInfo* t = file->find_tensor(name);
  if (!t) throw Error(model + ": no tensor named " + name);
  if (!cpu::matmul_supports(t->type))
    throw Error(name + ": type " + ggml_type_name(t->type) + " cannot be dequantized");
  const int64_t K = t->dims.empty() ? 1 : t->dims[0];
  const int64_t rows = t->rows();
  const size_t row_bytes = ggml_row_size(t->type, K);
  FATHOM_CHECK(row_bytes * static_cast<size_t>(rows) <= t->nbytes, "tensor bytes out of range");

  std::FILE* f = std::fopen(out.c_str(), "wb");
  if (!f) throw Error(out + ": cannot open for writing: " + std::strerror(errno));
  // Rows are dequantized in batches of about 1 MB of output.
  const int64_t batch = std::max<int64_t>(1, (1 << 18) / K);
  std::vector<float> buf(static_cast<size_t>(batch * K));
  for (int64_t r0 = 0; r0 < rows; r0 += batch) {
    const int64_t nr = std::min(batch, rows - r0);
    for (int64_t r = 0; r < nr; ++r) {
      float* dst = buf.data() + r * K;
      if (use_cpu) cpu::dequantize_row(t->type, t->data, K, r0 + r, dst);
      else ref::dequantize_row(t->type, t->data + (r0 + r) * row_bytes, dst, K);
    }
    if (std::fwrite(buf.data(), sizeof(float), nr * K, f) != static_cast<size_t>(nr * K)) {
      std::fclose(f);
      throw Error(out + ": write failed");
    }
  }
  if (std::fclose(f) != 0) throw Error(out + ": write failed");
  std::fprintf(stderr, "%s: %s %lld x %lld (%s%s)\n", name.c_str(), ggml_type_name(t->type),
               static_cast<long long>(rows), static_cast<long long>(K), use_cpu ? "cpu " : "ref",
               use_cpu ? cpu::simd_level() : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5) return usage();
  bool use_cpu = false;
  if (argc == 5) {
    if (std::strcmp(argv[4], "--cpu") != 0) return usage();
    use_cpu = true;
  }
  try {
    return run(argv[1], argv[2], argv[3], use_cpu);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_tensor: %s\n", e.what());
    return 1;
  }
}
