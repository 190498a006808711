#include "kernels/cpu/matmul_kernels.h"

namespace fathom::cpu::detail {

void register_avx512_dot_f32(KernelTable& t) { (void)t; }

}  // namespace fathom::cpu::detail
