#pragma once
// Random weight rows in every format the CUDA GEMVs read, with scales that keep values ~ 1
// (test_backend_ops, test_cuda_moe).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/ggml_type.h"
#include "kernels/quant_blocks.h"
#include "kernels/ref/dequant.h"

namespace fathom::test {

// `rows` random rows of `dim` elements stored as `type`, with scales that keep values ~ 1.
inline std::vector<uint8_t> random_rows(GgmlType type, int64_t rows, int64_t dim, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.5f, 1.5f);
  std::vector<uint8_t> out;
  auto append = [&out](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  for (int64_t r = 0; r < rows; ++r) {
    switch (type) {
      case GgmlType::F32:
        for (int64_t i = 0; i < dim; ++i) {
          const float v = normal(rng);
          append(&v, 4);
        }
        break;
      case GgmlType::F16:
      case GgmlType::BF16:
        for (int64_t i = 0; i < dim; ++i) {
          const float v = normal(rng);
          uint32_t bits;
          std::memcpy(&bits, &v, 4);
          const uint16_t h = type == GgmlType::F16 ? ref::fp32_to_fp16(v) : static_cast<uint16_t>(bits >> 16);
          append(&h, 2);
        }
        break;
      case GgmlType::Q8_0:
        for (int64_t b = 0; b < dim / 32; ++b) {
          quant::BlockQ8_0 q;
          q.d = ref::fp32_to_fp16(unit(rng) / 127.0f);
          for (int8_t& v : q.qs) v = static_cast<int8_t>(byte(rng) - 128);
          append(&q, sizeof(q));
        }
        break;
      case GgmlType::Q4_K:
        for (int64_t b = 0; b < dim / 256; ++b) {
          quant::BlockQ4_K q;
          q.d = ref::fp32_to_fp16(unit(rng) / 500.0f);
          q.dmin = ref::fp32_to_fp16(unit(rng) / 100.0f);
          for (uint8_t& v : q.scales) v = static_cast<uint8_t>(byte(rng));
          for (uint8_t& v : q.qs) v = static_cast<uint8_t>(byte(rng));
          append(&q, sizeof(q));
        }
        break;
      case GgmlType::Q6_K:
        for (int64_t b = 0; b < dim / 256; ++b) {
          quant::BlockQ6_K q;
          for (uint8_t& v : q.ql) v = static_cast<uint8_t>(byte(rng));
          for (uint8_t& v : q.qh) v = static_cast<uint8_t>(byte(rng));
          for (int8_t& v : q.scales) v = static_cast<int8_t>(byte(rng) - 128);
          q.d = ref::fp32_to_fp16(unit(rng) / 4000.0f);
          append(&q, sizeof(q));
        }
        break;
      case GgmlType::Q2_K:
        for (int64_t b = 0; b < dim / 256; ++b) {
          quant::BlockQ2_K q;
          for (uint8_t& v : q.scales) v = static_cast<uint8_t>(byte(rng));
          for (uint8_t& v : q.qs) v = static_cast<uint8_t>(byte(rng));
          q.d = ref::fp32_to_fp16(unit(rng) / 20.0f);
          q.dmin = ref::fp32_to_fp16(unit(rng) / 20.0f);
          append(&q, sizeof(q));
        }
        break;
      case GgmlType::Q3_K:
        for (int64_t b = 0; b < dim / 256; ++b) {
          quant::BlockQ3_K q;
          for (uint8_t& v : q.hmask) v = static_cast<uint8_t>(byte(rng));
          for (uint8_t& v : q.qs) v = static_cast<uint8_t>(byte(rng));
          for (uint8_t& v : q.scales) v = static_cast<uint8_t>(byte(rng));
          q.d = ref::fp32_to_fp16(unit(rng) / 50.0f);
          append(&q, sizeof(q));
        }
        break;
      case GgmlType::IQ4_NL:
        for (int64_t b = 0; b < dim / 32; ++b) {
          quant::BlockIQ4_NL q;
          q.d = ref::fp32_to_fp16(unit(rng) / 100.0f);
          for (uint8_t& v : q.qs) v = static_cast<uint8_t>(byte(rng));
          append(&q, sizeof(q));
        }
        break;
      case GgmlType::IQ4_XS:
        for (int64_t b = 0; b < dim / 256; ++b) {
          quant::BlockIQ4_XS q;
          q.d = ref::fp32_to_fp16(unit(rng) / 2000.0f);
          q.scales_h = static_cast<uint16_t>(byte(rng) | byte(rng) << 8);
          for (uint8_t& v : q.scales_l) v = static_cast<uint8_t>(byte(rng));
          for (uint8_t& v : q.qs) v = static_cast<uint8_t>(byte(rng));
          append(&q, sizeof(q));
        }
        break;
      case GgmlType::MXFP4:
        for (int64_t b = 0; b < dim / 32; ++b) {
          quant::BlockMXFP4 q;
          q.e = static_cast<uint8_t>(122 + byte(rng) % 6);  // 2^-6 .. 2^-1 (values up to 12 x that)
          for (uint8_t& v : q.qs) v = static_cast<uint8_t>(byte(rng));
          append(&q, sizeof(q));
        }
        break;
      default: ADD_FAILURE() << "random_rows: unsupported type";
    }
  }
  return out;
}

}  // namespace fathom::test
