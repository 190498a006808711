#pragma once
// gpt-oss's experts as a Hugging Face checkpoint stores them -> llama.cpp's GGUF layout, at load
// (llama.cpp's convert_hf_to_gguf.py GptOssModel does the same on disk). transformers fuses each
// layer's experts into a few tensors:
//   mlp.experts.gate_up_proj       [E, hidden, 2 inter]  x @ W: gate and up interleaved along the
//                                                         last dim (gate = [..., ::2], up = [..., 1::2])
//   mlp.experts.gate_up_proj_bias  [E, 2 inter]          interleaved the same way
//   mlp.experts.down_proj          [E, inter, hidden]
//   mlp.experts.down_proj_bias     [E, hidden]
// or, as released, the matrices MXFP4 (rows are output features, each row's input in blocks of 32):
//   mlp.experts.gate_up_proj_blocks [E, 2 inter, hidden/32, 16] u8: two e2m1 values a byte, element
//                                   2j in byte j's low nibble, 2j+1 in its high one; rows interleaved
//   mlp.experts.gate_up_proj_scales [E, 2 inter, hidden/32] u8: e8m0 exponents (2^(s-127))
//   mlp.experts.down_proj_blocks / _scales [E, hidden, inter/32, 16] / [E, hidden, inter/32]
// fathom's expert matrices are llama.cpp's: ffn_{gate,up}_exps [E, inter, hidden] and ffn_down_exps
// [E, hidden, inter] (rows of the output), biases ffn_{gate,up,down}_exps.bias. The plain matrices
// are transposed and split into owned copies of the same dtype (no rounding); the MXFP4 ones
// repacked into GGML's block (the same e8m0 byte, then 16 bytes: element j in byte j's low nibble,
// j + 16 in its high one), bit for bit the blocks llama.cpp's converter writes.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/model/gguf.h"
#include "engine/model/safetensors.h"

namespace fathom {

class GptOssExperts {
 public:
  // Dimensions from config.json (hf_config.h): the experts' count and width, the hidden size.
  GptOssExperts(int64_t n_layers, int64_t n_experts, int64_t inter, int64_t hidden)
      : n_layers_(n_layers), n_experts_(n_experts), inter_(inter), hidden_(hidden) {}

  // Takes `t` when it is one of the fused expert tensors above (model.layers.<i>.mlp.experts.<part>
  // of a layer below n_layers); false otherwise. `t.data` must outlive emit(). Throws for a second
  // copy of a part.
  bool take(const SafetensorsTensor& t, const std::string& shard);

  // The GGUF tensors of every layer's experts: copies in `owned` (GgufFile::assemble keeps them),
  // views for down_proj_bias. Throws fathom::Error naming the tensor for a shape other than the
  // config's, a dtype fathom does not read, blocks without their scales (or the reverse), or a
  // matrix given both plain and as blocks.
  void emit(std::vector<GgufTensorInfo>& tensors, std::vector<std::vector<uint8_t>>& owned) const;

 private:
  struct Part {
    SafetensorsTensor t;
    std::string shard;
  };
  int64_t n_layers_, n_experts_, inter_, hidden_;
  std::map<std::pair<int64_t, std::string>, Part> parts_;  // (layer, part) -> tensor
};

}  // namespace fathom
