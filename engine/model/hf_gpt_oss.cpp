#include "engine/model/hf_gpt_oss.h"

#include <cstring>
#include <string_view>

#include "base/error.h"
#include "engine/model/hf_json.h"

namespace fathom {
namespace {

constexpr std::string_view kParts[] = {"gate_up_proj",        "gate_up_proj_bias",   "down_proj",
                                       "down_proj_bias",      "gate_up_proj_blocks", "gate_up_proj_scales",
                                       "down_proj_blocks",    "down_proj_scales"};
constexpr int64_t kMxBlock = 32;      // values a block (the last dim of _blocks holds its 16 bytes)
constexpr size_t kMxBlockBytes = 17;  // GGML's block_mxfp4: the e8m0 byte, then 16 bytes of nibbles

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The GGUF tensor of `bytes` (moved into `owned`, which keeps the buffer where it is).
void add_owned(std::vector<GgufTensorInfo>& tensors, std::vector<std::vector<uint8_t>>& owned, std::string name,
               GgmlType type, std::vector<int64_t> dims, std::vector<uint8_t> bytes) {
  GgufTensorInfo info{};
  info.name = std::move(name);
  info.type = type;
  info.dims = std::move(dims);
  info.offset = 0;
  info.data = bytes.data();
  info.nbytes = bytes.size();
  tensors.push_back(std::move(info));
  owned.push_back(std::move(bytes));
}

// GGML's nibble order from transformers': HF's block holds element 2j in byte j's low nibble and
// 2j + 1 in its high one; GGML's byte j holds element j (low) and j + 16 (high).
void repack_block(const uint8_t* hf, uint8_t* ggml) {
  auto element = [&](int i) { return static_cast<uint8_t>(i % 2 ? hf[i / 2] >> 4 : hf[i / 2] & 0x0F); };
  for (int j = 0; j < 16; ++j) ggml[j] = static_cast<uint8_t>(element(j) | element(j + 16) << 4);
}

}  // namespace

bool GptOssExperts::take(const SafetensorsTensor& t, const std::string& shard) {
  constexpr std::string_view kLayers = "model.layers.", kExperts = ".mlp.experts.";
  std::string_view name = t.name;
  if (!name.starts_with(kLayers)) return false;
  name.remove_prefix(kLayers.size());
  int64_t layer = 0;
  size_t digits = 0;
  while (digits < name.size() && digits < 6 && name[digits] >= '0' && name[digits] <= '9')
    layer = layer * 10 + (name[digits++] - '0');
  if (digits == 0 || (name[0] == '0' && digits > 1) || layer >= n_layers_) return false;
  name.remove_prefix(digits);
  if (!name.starts_with(kExperts)) return false;
  name.remove_prefix(kExperts.size());
  bool known = false;
  for (std::string_view p : kParts) known = known || name == p;
  if (!known) return false;
  if (!parts_.emplace(std::pair{layer, std::string(name)}, Part{t, shard}).second)
    throw Error(shard + ": tensor " + hf::shown(t.name) + " is given twice");
  return true;
}

void GptOssExperts::emit(std::vector<GgufTensorInfo>& tensors, std::vector<std::vector<uint8_t>>& owned) const {
  const int64_t E = n_experts_, I = inter_, H = hidden_;
  for (int64_t il = 0; il < n_layers_; ++il) {
    const std::string blk = "blk." + std::to_string(il) + ".";
    auto part = [&](const char* name) -> const Part* {
      const auto it = parts_.find({il, name});
      return it == parts_.end() ? nullptr : &it->second;
    };
    auto check_shape = [&](const Part& p, const std::vector<int64_t>& want) {
      if (p.t.shape != want)
        throw Error(p.shard + ": tensor " + hf::shown(p.t.name) + " has shape " + shape_text(p.t.shape) +
                    ", expected " + shape_text(want) + " (config.json's experts)");
    };
    // A plain matrix or bias: its ggml type (F32, F16, BF16) and element size.
    auto plain = [&](const Part& p, const std::vector<int64_t>& want, size_t& elem) {
      GgmlType type;
      if (!safetensors_ggml_type(p.t.dtype, type))
        throw Error(p.shard + ": tensor " + hf::shown(p.t.name) + " has dtype " + hf::shown(p.t.dtype) +
                    ", which fathom does not read (F32, F16, BF16)");
      check_shape(p, want);
      elem = type == GgmlType::F32 ? 4 : 2;
      return type;
    };
    // The MXFP4 blocks and scales of `what` ([E, rows, cols/32, 16] and [E, rows, cols/32] u8), or none.
    auto mxfp4 = [&](const char* what, int64_t rows, int64_t cols) -> std::pair<const Part*, const Part*> {
      const Part* b = part((std::string(what) + "_blocks").c_str());
      const Part* s = part((std::string(what) + "_scales").c_str());
      if (!b && !s) return {nullptr, nullptr};
      if (!b || !s)
        throw Error((b ? b : s)->shard + ": tensor " + hf::shown((b ? b : s)->t.name) + " has no " +
                    (b ? "_scales" : "_blocks") + " beside it (gpt-oss's MXFP4 experts)");
      if (cols % kMxBlock != 0)
        throw Error(b->shard + ": tensor " + hf::shown(b->t.name) + ": MXFP4 rows of " + std::to_string(cols) +
                    " values are not whole blocks of 32");
      for (const Part* p : {b, s})
        if (p->t.dtype != "U8")
          throw Error(p->shard + ": tensor " + hf::shown(p->t.name) + " has dtype " + hf::shown(p->t.dtype) +
                      ", not U8 (gpt-oss's MXFP4 experts)");
      check_shape(*b, {E, rows, cols / kMxBlock, 16});
      check_shape(*s, {E, rows, cols / kMxBlock});
      return {b, s};
    };
    // GGML rows of every `step`-th row from `first` (gate: the even rows of gate_up, up: the odd ones).
    auto repack = [&](const Part& b, const Part& s, int64_t rows, int64_t cols, int64_t first, int64_t step,
                      const std::string& name) {
      const int64_t out_rows = rows / step, nb = cols / kMxBlock;
      std::vector<uint8_t> out(static_cast<size_t>(E * out_rows * nb) * kMxBlockBytes);
      uint8_t* o = out.data();
      for (int64_t e = 0; e < E; ++e)
        for (int64_t r = 0; r < out_rows; ++r) {
          const int64_t row = (e * rows + first + r * step) * nb;
          for (int64_t j = 0; j < nb; ++j, o += kMxBlockBytes) {
            o[0] = s.t.data[row + j];
            repack_block(b.t.data + (row + j) * 16, o + 1);
          }
        }
      add_owned(tensors, owned, blk + name, GgmlType::MXFP4, {cols, out_rows, E}, std::move(out));
    };

    // gate_up: [E, H, 2I] (x @ W, gate and up interleaved) -> ffn_gate_exps, ffn_up_exps [E, I, H].
    const Part* gate_up = part("gate_up_proj");
    const auto [gu_blocks, gu_scales] = mxfp4("gate_up_proj", 2 * I, H);
    if (gate_up && gu_blocks)
      throw Error(gate_up->shard + ": tensor " + hf::shown(gate_up->t.name) + " is also given as MXFP4 blocks");
    if (gate_up) {
      size_t elem = 0;
      const GgmlType type = plain(*gate_up, {E, H, 2 * I}, elem);
      for (int64_t which = 0; which < 2; ++which) {  // 0: gate (even columns), 1: up (odd)
        std::vector<uint8_t> out(static_cast<size_t>(E * I * H) * elem);
        for (int64_t e = 0; e < E; ++e)
          for (int64_t i = 0; i < I; ++i)
            for (int64_t h = 0; h < H; ++h)
              std::memcpy(&out[((e * I + i) * H + h) * elem],
                          gate_up->t.data + ((e * H + h) * 2 * I + 2 * i + which) * elem, elem);
        add_owned(tensors, owned, blk + (which ? "ffn_up_exps.weight" : "ffn_gate_exps.weight"), type, {H, I, E},
                  std::move(out));
      }
    } else if (gu_blocks) {
      repack(*gu_blocks, *gu_scales, 2 * I, H, 0, 2, "ffn_gate_exps.weight");
      repack(*gu_blocks, *gu_scales, 2 * I, H, 1, 2, "ffn_up_exps.weight");
    }
    if (const Part* bias = part("gate_up_proj_bias")) {
      size_t elem = 0;
      const GgmlType type = plain(*bias, {E, 2 * I}, elem);
      for (int64_t which = 0; which < 2; ++which) {
        std::vector<uint8_t> out(static_cast<size_t>(E * I) * elem);
        for (int64_t k = 0; k < E * I; ++k) std::memcpy(&out[k * elem], bias->t.data + (2 * k + which) * elem, elem);
        add_owned(tensors, owned, blk + (which ? "ffn_up_exps.bias" : "ffn_gate_exps.bias"), type, {I, E},
                  std::move(out));
      }
    }

    // down: [E, I, H] (x @ W) -> ffn_down_exps [E, H, I].
    const Part* down = part("down_proj");
    const auto [d_blocks, d_scales] = mxfp4("down_proj", H, I);
    if (down && d_blocks)
      throw Error(down->shard + ": tensor " + hf::shown(down->t.name) + " is also given as MXFP4 blocks");
    if (down) {
      size_t elem = 0;
      const GgmlType type = plain(*down, {E, I, H}, elem);
      std::vector<uint8_t> out(static_cast<size_t>(E * I * H) * elem);
      for (int64_t e = 0; e < E; ++e)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < I; ++i)
            std::memcpy(&out[((e * H + h) * I + i) * elem], down->t.data + ((e * I + i) * H + h) * elem, elem);
      add_owned(tensors, owned, blk + "ffn_down_exps.weight", type, {I, H, E}, std::move(out));
    } else if (d_blocks) {
      repack(*d_blocks, *d_scales, H, I, 0, 1, "ffn_down_exps.weight");
    }
    if (const Part* bias = part("down_proj_bias")) {  // [E, H]: already llama.cpp's layout
      size_t elem = 0;
      GgufTensorInfo info{};
      info.name = blk + "ffn_down_exps.bias";
      info.type = plain(*bias, {E, H}, elem);
      info.dims = {H, E};
      info.offset = 0;
      info.data = bias->t.data;
      info.nbytes = bias->t.nbytes;
      tensors.push_back(std::move(info));
    }
  }
}

}  // namespace fathom
